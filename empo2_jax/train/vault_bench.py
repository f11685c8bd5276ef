"""The vault bench (docs/vault_bench.md): does an objective move what the memory tips achieve into
the tip-free weights? One start (a format SFT), one oracle memory, arms x seeds, each arm-seed's
record (metrics and exact scores, no weights) written as it finishes, so a run stops and resumes
at any arm-seed. launch/vault_bench.py is its command.

    bench = Bench(config, root, records)   # config: configs/vault.py[:small|:cpu] + overrides
    bench.start()                          # the format SFT -> <root>/start/sft/hf
    bench.gate()                           # the start's figures -> <records>/gate.json
    bench.arm("F", seed=0)                 # -> <records>/arms/F_s0.json

The arms (ARMS) share the start, the trained vaults, the memory, the learning rate and the number
of iterations; each changes only what the table below says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from typing import Mapping, Optional

import numpy as np

import jax

from empo2_jax import methods
from empo2_jax.config_keys import lookup
from empo2_jax.train import vault_data
from empo2_jax.train.view_metrics import mixed_share


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  method: str
  overrides: Mapping[str, object]
  memory: str  # "oracle": each vault's own code; "shifted": another vault's (vault_data)
  what: str


_OFF = {"empo2.force_mode": "off"}
ARMS = {
  a.name: a
  for a in (
    Arm("D", "empo2", {"empo2.force_mode": "on"}, "oracle", "on-policy without tips (control)"),
    Arm("A", "empo2", _OFF, "oracle", "EMPO2 paper-era off-policy: tip-free old log-prob, mask"),
    Arm("B", "empo2", {**_OFF, "loss.low_prob_mask": False}, "oracle", "A without the mask"),
    Arm(
      "E",
      "empo2_release",
      {**_OFF, "optim.prompt_len_check": "tip_free"},
      "oracle",
      "release ratio (old log-prob WITH tips), no mask; length check on the tip-free prompt",
    ),
    Arm("F", "ctx_distill", _OFF, "oracle", "on-policy context distillation (reverse KL)"),
    Arm("F+", "ctx_distill", {**_OFF, "ctx_distill.edge_gate": True}, "oracle", "F, EDGE's gate"),
    Arm("G", "opid", {**_OFF, "opid.tip_source": "memory"}, "oracle", "OPID, memory tips"),
    Arm(
      "P",
      "empo2",
      {
        **_OFF,
        "advantage.estimator": "return_positive",
        "loss.policy_loss": "nll",
        "loss.low_prob_mask": False,
      },
      "oracle",
      "positive control: supervised on tip-guided successes, tips stripped",
    ),
    Arm("W", "ctx_distill", _OFF, "shifted", "negative control: F given another vault's tips"),
  )
}


class Preempted(RuntimeError):
  """An arm-seed's training stopped before its last iteration (SIGTERM); nothing was recorded."""


def arm_config(base, arm: Arm, seed: int, start_hf: str):
  """The config of one arm-seed: `base` (copied) with the arm's method and overrides, the seed,
  the start's weights and a frozen memory (the bench installs it after the trainer is built)."""
  c = base.copy_and_resolve_references()
  c.unlock()
  methods.apply(c, arm.method)
  for path, value in arm.overrides.items():
    node, key = lookup(c, path)
    node[key] = value
  c.seed = int(seed)
  c.model.checkpoint = start_hf
  c.model.random_init = False
  c.model.tokenizer = ""
  c.memory.frozen = True
  c.memory.init_from = ""
  c.train.eval_every = 0
  c.train.eval_at_end = False
  c.train.checkpoint_every = 0
  c.train.keep_checkpoints = 1
  c.lock()
  return c


def _write_json(path: str, obj) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


# The metrics an arm-seed's record keeps from each iteration (when the iteration logged them).
KEPT = (
  "mode", "return_mean", "success", "groups_mixed", "memory_size", "advantage_abs_mean", "samples",
  "dropped_long", "retrieval_hits_per_step", "loss/pg_loss", "loss/ratio_p5", "loss/ratio_p50",
  "loss/ratio_p95", "loss/pos_adv_low_ratio", "loss/ctx_kl", "loss/ctx_kl_k1",
  "loss/ctx_kl_tokens", "loss/opid/abs_added", "loss/opid/abs_adv", "loss/opid/gain",
  "loss/grad_norm", "ctx_distill/teacher_turns", "ctx_distill/plain_grpo",
  "ctx_distill/edge_open_share", "opid/teacher_turns", "opid/plain_grpo", "teacher/turns",
  "views/lowprob_masked_share", "time/iteration",
)  # fmt: skip


class Bench:
  """The bench over one base config (module docstring). `root`: the run's working files (the
  start, the arm workdirs while they run); `records`: the small files to keep (gate, arm-seeds)."""

  def __init__(
    self, config, root: str, records: str, *, p_copy=0.75, sft_vaults=1024, sft_tips="oracle"
  ):
    self.c, self.root, self.records = config, os.path.abspath(root), records
    self.p_copy, self.sft_vaults, self.sft_tips = p_copy, sft_vaults, sft_tips
    from empo2_jax.train import build

    self.env = build.suite(config).local_env(build.env_config(config))
    self.trained = self.env.used_variations(vault_data.TASK, "train")
    self.unseen = self.env.used_variations(vault_data.TASK, "test")
    names = [vault_data.vault.vault_name(v) for v in self.trained + self.unseen]
    if len(set(names)) != len(names):
      raise ValueError(f"the bench's vaults share names: {names}; choose other variation counts")
    self.names = names
    self.rebuilt = False  # the start's weights were gone and were built again (start())

  @property
  def start_hf(self) -> str:
    return os.path.join(self.root, "start", "sft", "hf")

  # -------------------------------------------------------------------------------- the start
  def start(self) -> dict:
    """The format SFT (train/sft_loop.run_sft on vault_data.sft_chats) of the config's model,
    once: its summary (with the data's figures), also in <records>/start.json. Records whose
    start's weights are gone (a fresh machine) get the start built again, its summary in
    start_rebuilt.json, and gate() measures the rebuilt start again."""
    out = os.path.join(self.records, "start.json")
    if os.path.exists(out) and os.path.isdir(self.start_hf):
      with open(out) as f:
        return json.load(f)
    self.rebuilt = os.path.exists(out)
    if self.rebuilt:
      out = os.path.join(self.records, "start_rebuilt.json")
    from empo2_jax.train.sft_loop import run_sft
    from empo2_jax.train.trainer import Trainer

    rng = np.random.default_rng(int(self.c.seed))
    seeds = vault_data.sft_vault_seeds(self.sft_vaults, self.names)
    chats = vault_data.sft_chats(self.env, seeds, rng, self.p_copy, self.sft_tips)
    t0 = time.perf_counter()
    workdir = os.path.join(self.root, "start")
    trainer = Trainer(self.c, workdir, progress=False)
    try:
      summary = run_sft(self.c, workdir, trainer, chats)
    finally:
      trainer.close()
    summary.update(
      sft_vaults=len(seeds), chats=len(chats), p_copy=self.p_copy, sft_tips=self.sft_tips,
      seconds=time.perf_counter() - t0, model=self.c.model.checkpoint or self.c.model.preset,
    )  # fmt: skip
    _write_json(out, summary)
    return summary

  # -------------------------------------------------------------------------------- the gate
  def gate(self, repeats: int = 4) -> dict:
    """The start's figures on the trained vaults (<records>/gate.json): sampled success at the
    rollout temperature with the oracle tips and without (variations x group_size x `repeats`
    episodes each), the share of groups with mixed outcomes, and the exact code probabilities.
    The gate holds when with-tip success is in [0.60, 0.90] and tip-free success <= 0.03. A
    rebuilt start (start()) is measured again, into gate_rebuilt.json: its arms run only if that
    gate holds too."""
    rebuilt = os.path.join(self.records, "gate_rebuilt.json")
    out = rebuilt if self.rebuilt else os.path.join(self.records, "gate.json")
    for done in () if self.rebuilt else (rebuilt, out):  # a rebuilt start's gate comes first
      if os.path.exists(done):
        with open(done) as f:
          return json.load(f)
    arm = dataclasses.replace(ARMS["A"], overrides={"empo2.force_mode": "on_tips"})
    c = arm_config(self.c, arm, 0, self.start_hf)
    res: dict = {"episodes_each": len(self.trained) * c.rollout.group_size * repeats}
    with self._trainer(c, "gate", "oracle") as trainer:
      for label, mode in (("with_tips", "on_tips"), ("tip_free", "on")):
        succ, mixed = [], []
        for r in range(repeats):
          key = jax.random.PRNGKey(1000 + r)
          with contextlib.closing(trainer.rollout(self.trained, mode, key)) as roll:
            eps = [e for e in roll.episodes if not e.env_failed]
          succ += [float(e.success) for e in eps]
          mixed.append(mixed_share(eps))
        res[label] = {"success": float(np.mean(succ)), "groups_mixed": float(np.mean(mixed))}
      res["exact"] = self._scores(trainer)
    res["holds"] = bool(
      0.60 <= res["with_tips"]["success"] <= 0.90 and res["tip_free"]["success"] <= 0.03
    )
    _write_json(out, res)
    return res

  # -------------------------------------------------------------------------------- the arms
  def arm(self, name: str, seed: int, iterations: Optional[int] = None) -> dict:
    """One arm-seed from the start: its iterations, then its record (<records>/arms/<arm>_s<seed>
    .json: the per-iteration metrics in KEPT and the exact scores). Done arm-seeds are read."""
    out = os.path.join(self.records, "arms", f"{name}_s{seed}.json")
    if os.path.exists(out):
      with open(out) as f:
        return json.load(f)
    arm = ARMS[name]
    c = arm_config(self.c, arm, seed, self.start_hf)
    if iterations:
      c.unlock()
      c.train.iterations = int(iterations)
      c.lock()
    t0 = time.perf_counter()
    with self._trainer(c, f"{name}_s{seed}", arm.memory) as trainer:
      history = trainer.run()  # closes the trainer; its params stay
      if trainer.preempted:  # stopped short (SIGTERM): no record, the rerun redoes this arm-seed
        raise Preempted(
          f"arm {name} seed {seed} stopped after iteration {trainer.iteration} of "
          f"{c.train.iterations} (SIGTERM); no record written, a rerun starts this arm-seed over"
        )
      scores = self._scores(trainer)
    record = {
      "arm": name,
      "seed": int(seed),
      "method": arm.method,
      "overrides": {k: v for k, v in arm.overrides.items()},
      "memory": arm.memory,
      "iterations": int(c.train.iterations),
      "lr": float(c.optim.lr),
      "seconds": time.perf_counter() - t0,
      "metrics": [{k: m[k] for k in KEPT if k in m} for m in history],
      "scores": scores,
    }
    _write_json(out, record)
    return record

  @contextlib.contextmanager
  def _trainer(self, c, name: str, memory: str):
    """A Trainer for `c` in <root>/runs/<name> with the bench's frozen memory installed; the
    workdir (its checkpoint) is removed afterwards: the records keep what the bench reports."""
    from empo2_jax.train.trainer import Trainer

    workdir = os.path.join(self.root, "runs", name)
    shutil.rmtree(workdir, ignore_errors=True)  # an arm-seed cut off earlier starts over
    trainer = Trainer(c, workdir, progress=False)
    try:
      trainer.resume()
      cfg = self.env.config
      tips = {
        "oracle": {v: vault_data.oracle_tip(v, cfg) for v in self.trained},
        "shifted": vault_data.shifted_tips(self.trained, cfg),
      }[memory]
      store = vault_data.vault_memory(trainer.memory.encoder, self.env, self.trained, tips)
      trainer.memory.replace_store(store)
      yield trainer
    finally:
      trainer.close()
      shutil.rmtree(workdir, ignore_errors=True)

  def _scores(self, trainer) -> dict:
    """Exact scores of the trainer's params: tip-free on the trained and unseen vaults, and on
    the trained vaults with their oracle tips."""
    p, mc, tok = trainer.state.params, trainer.model_config, trainer.tokenizer
    cfg = self.env.config
    tips = {v: vault_data.oracle_tip(v, cfg) for v in self.trained}

    def keyed(d):
      return {str(k): v for k, v in d.items()}

    return {
      "trained": keyed(vault_data.score_vaults(p, mc, tok, self.env, self.trained)),
      "unseen": keyed(vault_data.score_vaults(p, mc, tok, self.env, self.unseen)),
      "trained_with_tips": keyed(vault_data.score_vaults(p, mc, tok, self.env, self.trained, tips)),
    }


__all__ = ["Arm", "ARMS", "KEPT", "Bench", "Preempted", "arm_config"]
