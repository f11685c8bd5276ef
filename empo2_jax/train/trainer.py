"""The EMPO2 training loop (docs/method.md §1): draw a mode, roll out, reflect, build batches,
update, log.

    trainer = Trainer(config, workdir)
    trainer.run()            # config.train.iterations iterations, eval every eval_every

Everything with side effects (env processes, files, the JVMs) lives here and in the actor; the
update, losses and advantages are the pure kernels of empo2_jax.rl. Beside the algorithm:
evaluation (train/evaluate.py), the run loop, preemption and profiling (train/run_control.py),
the iteration's metrics (train/view_metrics.py), the old log-probs' source
(train/old_logp_source.py), checkpoints (train/checkpoint.py), a non-finite update's report
(train/faults.py), the iteration's small pieces (train/iteration.py: the mode draw, the episode
specs, the trained turns, the iteration's result), the env side's set-up (train/build.py
`rollout_setup`).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Optional

import numpy as np

import jax
import jax.numpy as jnp

from empo2_jax import methods
from empo2_jax.agent import hosts
from empo2_jax.agent.actor import Actor, Rollout
from empo2_jax.model import lora
from empo2_jax.rl import advantages as adv_lib
from empo2_jax.rl import batch as batch_lib
from empo2_jax.rl import minibatch as minibatch_lib
from empo2_jax.rl import update as update_lib
from empo2_jax.train import build
from empo2_jax.train import checkpoint as ckpt_lib
from empo2_jax.train import faults, settings, view_metrics
from empo2_jax.train.hoststats import PhasePeaks, release_host_memory
from empo2_jax.train.iteration import (
  UPDATE_FLOOR_KEYS,
  IterationResult,
  draw_mode,
  group_specs,
  memory_flags,
  rollout_timing,
  trainable_turns,
)
from empo2_jax.train.faults import NonFiniteError
from empo2_jax.train.evaluate import Evaluator, eval_metrics
from empo2_jax.train.metrics import MetricsWriter, is_remote
from empo2_jax.train.old_logp_source import OldLogpSource
from empo2_jax.train.run_control import StopSignal, run_loop
from empo2_jax.train.teacher import score_teacher_views


class Trainer:
  def __init__(self, config, workdir: str, *, progress: bool = True):
    if "://" not in str(workdir):  # orbax wants absolute local paths
      workdir = os.path.abspath(workdir)
    self.config, self.workdir = config, workdir
    build.check_config(config)  # fails at once on a missing checkpoint, bad mode, ...
    if not is_remote(workdir):  # gs://: no directories to make; os.makedirs would make gs:/ here
      os.makedirs(workdir, exist_ok=True)
    c = config
    self.model_config, params = build.policy(c)
    self.tokenizer = build.tokenizer(c)
    self.mesh = build.mesh(c)
    self.update_cfg = settings.update_config(c)
    # The sampler's log-probs as old ones, where they serve (train/old_logp_source.py).
    self.old_logp_source = OldLogpSource(c, self.update_cfg)
    self._teacher_logprobs = None  # jitted when a method first asks for teacher views
    self.batch_cfg = settings.batch_config(c, self.tokenizer.pad_token_id)
    self.optimizer = update_lib.make_optimizer(self.update_cfg)
    # optim.update_shapes="grow": the largest update shape so far (checkpointed; see defaults.py)
    self.update_floor = dict.fromkeys(UPDATE_FLOOR_KEYS, 0)
    self.state, self._update = build.train_state(
      self.model_config, self.update_cfg, self.optimizer, params, self.mesh
    )
    # The KL reference: a copy of the starting weights; with LoRA none (the update reads the frozen
    # base in its state) and the base's fingerprint, which checkpoints record (train/checkpoint.py)
    lora_run = self.model_config.lora_rank > 0
    policy = self.state.params
    self.ref_params = jax.tree.map(jnp.copy, policy) if c.loss.kl_coef and not lora_run else None
    self.base_fingerprint = lora.fingerprint(lora.split(policy)[1]) if lora_run else None
    # Loading the weights leaves freed host copies (the file's dtype, the conversion) in glibc's
    # heap: hand them back now, or they sit under every later peak (0.57 GiB for SmolLM2).
    del params
    release_host_memory()

    self.pool, self.train_variations, self.test_variations, materials, self.memory = (
      build.rollout_setup(c)
    )
    # The active method plugins' hooks (empo2_jax/methods/: RND, SGE, HeRL, SPA's answer span);
    # EMPO2 and GRPO have none.
    self.prompt_set = prompt_set = build.suite(c).prompts  # the env's messages (envs/registry.py)
    self.hooks = methods.Hooks(c, encoder=self.memory.encoder, score_out_of=prompt_set.score_out_of)
    self.actor = Actor(
      self.pool,
      self.tokenizer,
      materials,
      self.memory,
      settings.actor_settings(c),
      # Multi-host: each host samples its share of the episodes on its own devices.
      mesh=self.mesh if jax.process_count() == 1 else hosts.local_mesh(c.mesh),
      prompt_set=prompt_set,
      env_text=self.hooks.env_text,  # what the env reads of a response
    )
    # A host (numpy) copy: every process holds the same key, and orbax refuses to checkpoint
    # host-local jax arrays in a multi-host run.
    self.rng = np.asarray(jax.random.PRNGKey(c.seed))
    self.iteration = 0
    self.variation_cursor = 0
    self.progress = progress
    self.metrics = MetricsWriter(
      workdir, total=c.train.iterations, progress=progress, desc=c.method
    )
    # Checkpoints (train/checkpoint.py): every checkpoint_every iterations (0: never), at the end,
    # and after the iteration in progress when SIGTERM (a preemption notice) arrives.
    self.checkpointer = ckpt_lib.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      keep=c.train.keep_checkpoints,
      async_save=ckpt_lib.async_saves(c.train.checkpoint_async, jax.default_backend()),
    )
    self.phase_peaks = PhasePeaks()
    self.episode_log = None
    if c.train.save_episodes:
      from empo2_jax.data.trajectories import EpisodeLog

      self.episode_log = EpisodeLog(os.path.join(workdir, "episodes"))
    self.evaluator = Evaluator(c, self.actor, self.model_config, notes=self.hooks.eval_notes)
    self.preempted = False
    self.state_is_bad = False  # a non-finite update: nothing saves this state
    # SIGTERM (a preemption notice): stop after the iteration in progress or, once iterations
    # are long, at a turn boundary within train.stop_deadline_s (train/run_control.py).
    self.stop_signal = StopSignal(lambda: self.iteration, c.train.stop_deadline_s, self.pool.kill)
    self.stop_note = ""  # how a preempted run stopped (run_control.run_loop)

  # ------------------------------------------------------------------------------------------
  def resume(self, read_only: bool = False) -> Optional[int]:
    """Continue from the newest restorable checkpoint in the workdir; its step, or None.

    read_only (evaluation): load the state but leave the run's metrics and episodes untouched.
    """
    if read_only or jax.process_index() != 0:  # multi-host: process 0 owns the run's files
      return ckpt_lib.restore_trainer(self.checkpointer, self, rewrite_metrics=False)
    self.metrics.close()  # metrics.jsonl is rewritten to the checkpoint's records
    try:
      step = ckpt_lib.restore_trainer(self.checkpointer, self)
      if step is None:  # a fresh start: drop records of an earlier, unsaved attempt
        ckpt_lib.rewrite_records(self.workdir, [])
    finally:
      self.metrics = MetricsWriter(
        self.workdir,
        total=self.config.train.iterations,
        start=self.iteration,
        progress=self.progress,
        desc=self.config.method,  # the progress bar names the run's method
      )
    self.metrics.drop_after(self.iteration)  # TensorBoard: the killed run's later events go
    if step is not None and self.episode_log is not None:
      self.episode_log.drop_after(step)
    return step

  def save_checkpoint(self, wait: bool = False) -> int:
    if self.state_is_bad:
      raise RuntimeError("the train state is non-finite (NonFiniteError); not checkpointing it")
    try:
      self.metrics.sync()  # a remote workdir gets the records the checkpoint reads from it
    except OSError as e:
      raise faults.write_error(self, f"the metrics up to iteration {self.iteration}", e) from e
    return ckpt_lib.save_trainer(self.checkpointer, self, wait=wait)

  def variations_for_iteration(self) -> list[int]:
    """variations_per_iter training variations, walking a per-epoch permutation of them."""
    n, out = len(self.train_variations), []
    for _ in range(self.config.rollout.variations_per_iter):
      epoch, pos = divmod(self.variation_cursor, n)
      perm = np.random.default_rng([self.config.seed, epoch]).permutation(n)
      out.append(self.train_variations[perm[pos]])
      self.variation_cursor += 1
    return out

  def rollout_context(self, memory_entries: Optional[int] = None) -> methods.RolloutContext:
    """What a method's hook may roll out: episodes of the current policy, without memory.
    memory_entries: the tips the iteration's slots held when its rollout began."""

    def rollout(specs, *, notes, temperature, rng):
      params = self.sampling_params()
      return self.actor.rollout(
        params, self.model_config, specs, use_memory=False, temperature=temperature, rng=rng,
        mode="on", notes=notes,
      )  # fmt: skip

    return methods.RolloutContext(
      rollout=rollout,
      seed=int(self.config.seed),
      score_out_of=self.prompt_set.score_out_of,
      chats_with_tips=self.actor.chats_with_tips,
      memory_entries=memory_entries,
    )

  def slot_entries(self, variations) -> int:
    """The tips the memory slots of `variations` hold now."""
    slots = (self.memory.store.slot((self.config.env.task, v)) for v in set(variations))
    return sum(len(s) for s in slots if s is not None)

  def sampling_params(self):
    """The policy weights for the actor's sampler (multi-host: a copy on this host's devices)."""
    return hosts.sampling_params(self.state.params, self.actor.mesh)

  def _mode(self, key) -> str:
    forced = self.config.empo2.force_mode
    if forced:
      return forced
    u = float(jax.random.uniform(key))
    return draw_mode(u, self.config.empo2.p_memory, self.config.empo2.q_offpolicy)

  def _memory_read(self) -> bool:
    """Whether anything of this run reads the tip memory."""
    e, t = self.config.empo2, self.config.train
    return e.p_memory > 0 or e.force_mode in ("on_tips", "off") or t.eval_with_memory

  def _update_floor(self) -> dict:
    """The least update shape of this iteration (optim.update_shapes; defaults.py)."""
    mode = self.batch_cfg.update_shapes
    if mode == "fit":
      return dict.fromkeys(self.update_floor, 0)
    if mode == "max":
      top = settings.max_update_shape(self.config, self.batch_cfg, self.update_cfg)
      return {k: max(v, top[k]) for k, v in self.update_floor.items()}
    return self.update_floor

  def train_iteration(self) -> IterationResult:
    """One EMPO2 iteration (docs/method.md §1; docs/architecture.md, "One iteration"): what it
    made (metrics, episodes, batch, per-sample figures). Everything random derives from (seed,
    iteration). The caller advances self.iteration (train/run_control.run_loop)."""
    it = self.iteration
    k_mode, k_roll = jax.random.split(jax.random.fold_in(self.rng, it))
    mode = self._mode(k_mode)
    t0 = time.perf_counter()
    variations = self.variations_for_iteration()
    held = self.slot_entries(variations)  # before the reflection adds this rollout's tips
    with self.phase_peaks.phase("rollout"):
      rollout = self.rollout(variations, mode, k_roll)
    with self.phase_peaks.phase("reflect"):
      rollout_stats = {**rollout.stats, **self.reflect(rollout)}
    with self.phase_peaks.phase("explore"):
      # The methods' step after the rollout (RND rewards, HeRL's guided episodes): what is
      # trained on; the returns in the metrics stay those of the policy's own episodes.
      trained, explore_metrics = self.hooks.after_rollout(
        self.rollout_context(held), rollout.episodes, it, mode, k_roll
      )
      # Teacher views a method asked for (rl/loss_terms.py): scored by the current weights.
      explore_metrics.update(self.score_teachers(trained))
    timing = rollout_timing(rollout_stats, time.perf_counter() - t0)

    t0 = time.perf_counter()
    with self.phase_peaks.phase("batching"):
      turns = trainable_turns(trained)
      advantages = self.advantages(turns)
      # An "off" iteration's samples are built on the tip-free view (rl/batch.views_for).
      batch, bstats, layout = self.batch(turns, advantages)
    timing["time/batching"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with self.phase_peaks.phase("update"):
      upd, per_sample = self.update(mode, batch, layout, bstats["n_samples"])
    timing["time/update"] = time.perf_counter() - t0
    info = dict(
      update=upd, batch=bstats, rollout=rollout_stats, timing=timing, variations=variations
    )
    self._stop_if_nonfinite(mode, upd, info, advantages, batch)

    metrics = view_metrics.iteration_metrics(
      mode, rollout.episodes, turns, advantages, rollout_stats, bstats, len(self.memory.store)
    )
    # What the mask and the length check did to each view; per turn into the saved episodes.
    view_metrics.attach(turns, batch["sample_index"], per_sample)
    views = view_metrics.view_metrics(
      turns,
      batch["sample_index"],
      per_sample,
      rollout.episodes,
      rollout_stats,
      response_len=self.batch_cfg.response_len,
      low_prob_delta=self.config.loss.low_prob_delta,
    )
    return IterationResult(
      metrics={**metrics, **upd, **timing, **explore_metrics, **views},
      episodes=rollout.episodes,
      batch=batch,
      per_sample=per_sample,
    )

  def rollout(self, variations: list[int], mode: str, key) -> Rollout:
    """rollout.group_size episodes of each variation (one GRPO group a variation), with memory
    tips unless the mode is "on" (docs/method.md §1) or a method says otherwise
    (Plugin.memory_view).
    Multi-host: every host steps its share of the episodes; all get every episode back."""
    c = self.config
    specs = group_specs(c.env.task, variations, c.rollout.group_size)
    shown, shadow = memory_flags(self.hooks.memory_view(mode), len(specs), c.rollout.group_size)
    return self.actor.rollout(
      self.sampling_params(),
      self.model_config,
      specs,
      use_memory=shown,
      shadow_memory=shadow,
      temperature=c.rollout.temperature,
      rng=key,
      mode=mode,
      notes=self.hooks.train_notes(specs, self.iteration),
      sampler=self.hooks.train_sampler(),
      stop_check=self.stop_signal.check_turn,  # a preemption stop at a turn boundary
    )

  def reflect(self, rollout: Rollout) -> dict:
    """Every finished episode's tip into memory, in every mode (docs/method.md §1 item 3, §2-3:
    Actor.reflect), then the rollout's sampler session is freed; the tip statistics. Tips are
    written only when something reads them: a run without memory rollouts (GRPO, p_memory = 0)
    and without evaluation with memory skips the tip sampling."""
    with contextlib.closing(rollout):
      return self.actor.reflect(rollout, self.iteration) if self._memory_read() else {}

  def score_teachers(self, episodes) -> dict:
    """teacher_logprobs for every turn a method gave teacher_messages (train/teacher.py), under
    the weights the update starts from; the counts."""
    turns = trainable_turns(episodes)
    if not any(t.teacher_messages is not None for t in turns):
      return {}
    if self._teacher_logprobs is None:
      self._teacher_logprobs = update_lib.sample_logprobs_fn(self.model_config, self.update_cfg)
    return score_teacher_views(
      self.state.params, turns, self.tokenizer, self.batch_cfg, self._teacher_logprobs
    )

  def advantages(self, turns: list) -> np.ndarray:
    """Each turn's advantage (docs/method.md §6, advantage.estimator), also kept on the turn
    (saved with the episodes: data/trajectories.py; launch/inspect_run.py)."""
    a = self.config.advantage
    advantages = adv_lib.turn_advantages(turns, a.estimator, a)  # rl/advantages.ESTIMATORS
    for t, x in zip(turns, np.asarray(advantages, np.float64).tolist()):
      t.advantage = x
    return advantages

  def batch(self, turns: list, advantages) -> tuple[dict, dict, dict]:
    """(batch, its statistics, its mini-batch layout): every turn one sample (docs/method.md §1
    item 4) whose prompt views follow its mode (rl/batch.views_for; docs/method.md §4), over-long
    prompts dropped; one row per episode and view (optim.layout "packed", rl/packing.py) or one
    per turn; then shuffled into mini-batches of optim.minibatch_size samples (docs/method.md §1
    item 5). The shuffle depends on (seed, iteration) only, so a resumed run repeats it."""
    c, fl = self.config, self._update_floor()
    if self.batch_cfg.layout == "packed":
      batch, bstats = batch_lib.build_packed_batch(
        turns, advantages, self.tokenizer, self.batch_cfg, min_len=fl["len"], min_turns=fl["turns"]
      )
    else:
      batch, bstats = batch_lib.build_batch(
        turns, advantages, self.tokenizer, self.batch_cfg, min_len=fl["len"]
      )
    batch, layout = minibatch_lib.arrange(
      batch,
      self.update_cfg,
      seed=(c.seed, self.iteration),
      min_slots=fl["slots"],
      min_slot_rows=fl["slot_rows"],
    )
    if self.batch_cfg.update_shapes != "fit":
      shape = minibatch_lib.update_shape(batch, layout)
      self.update_floor = {k: max(v, shape[k]) for k, v in self.update_floor.items()}
    return batch, bstats, layout

  def update(
    self, mode: str, batch: dict, layout: dict, n_samples: int
  ) -> tuple[dict, Optional[dict]]:
    """The PPO update of the train state on `batch` (rl/update.py; docs/method.md §5).

    Returns:
      (metrics, per_sample): loss metrics (loss/update_norm, the global norm of a step's weight
      change, among them) are per-step means, optim_steps counts the steps and keeps its own
      name; per_sample holds the per-sample figures (train/view_metrics.py), None when the batch
      has no sample.
    """
    if not n_samples:
      return {"optim_steps": 0.0, "loss/update_norm": 0.0}, None
    c = self.config
    args = (self.ref_params,) if self.ref_params is not None else ()
    if self.mesh is not None:
      from empo2_jax.parallel import sharding as shd

      batch = shd.shard_batch(batch, self.mesh)
    old_from_sampler = self.old_logp_source.from_sampler(mode, batch)
    self.state, upd = self._update(self.state, batch, *args, old_from_sampler=old_from_sampler)
    upd = hosts.host_values(upd)  # per_sample is batch-sharded: gathered on several hosts
    per_sample = upd.pop("per_sample")  # per turn sample: train/view_metrics.py
    upd = {(k if k == "optim_steps" else f"loss/{k}"): float(v) for k, v in upd.items()}
    if int(upd["optim_steps"]) != layout["num_minibatches"] * c.optim.epochs:
      raise RuntimeError(
        f"iteration {self.iteration}: the update took {upd['optim_steps']:g} optimizer "
        f"steps for {layout['num_minibatches']} mini-batches x "
        f"{c.optim.epochs} epochs"
      )
    self.old_logp_source.check(self.iteration, upd)
    return upd, per_sample

  def _stop_if_nonfinite(self, mode: str, upd: dict, info: dict, advantages, batch) -> None:
    """NonFiniteError on a non-finite update metric, before anything saves this state; the batch
    goes to <workdir>/debug/iter_N (train/faults.py)."""
    bad = faults.nonfinite(upd)
    if not bad:
      return
    self.state_is_bad = True
    info = dict(info, seed=self.config.seed, advantages=np.asarray(advantages, np.float64))
    lead = jax.process_index() == 0
    raise faults.nonfinite_error(self, self.iteration + 1, mode, bad, info, batch, lead)

  def eval_episodes(self, with_memory: bool = False) -> list:
    """The test variations' episodes of the current policy (train/evaluate.Evaluator), drawn
    with the iteration's evaluation key."""
    rng = jax.random.fold_in(self.rng, 10_000_000 + self.iteration)
    return self.evaluator.episodes(self.sampling_params(), rng, self.test_variations, with_memory)

  def evaluate(self, with_memory: bool = False) -> dict:
    """The evaluation metrics (train/evaluate.eval_metrics) and their time."""
    t0 = time.perf_counter()
    with self.phase_peaks.phase("eval"):
      episodes = self.eval_episodes(with_memory)
    tag = "eval_mem" if with_memory else "eval"
    return {**eval_metrics(episodes, with_memory), f"time/{tag}": time.perf_counter() - t0}

  def run(self, iterations: Optional[int] = None) -> list[dict]:
    """Iterations up to `iterations` (config.train.iterations), with evaluation, records and
    checkpoints between them (train/run_control.run_loop); the metrics of each. Closes the
    trainer at the end."""
    return run_loop(self, self.config.train.iterations if iterations is None else iterations)

  def close(self) -> None:
    """Close everything, then raise the first error (CheckpointSaveError: the last async save
    failed)."""
    errors = []
    closers = (self.checkpointer.close, self.stop_signal.close, self.metrics.close, self.pool.close)
    for fn in closers:
      try:
        fn()  # checkpointer.close waits for an async save in flight
      except Exception as e:  # noqa: BLE001 - close the rest first
        errors.append(e)
    if errors:
      raise errors[0]


__all__ = ["IterationResult", "Trainer", "draw_mode", "NonFiniteError"]
