"""SPA (METHODS.md §7; empo2_jax/explore/spa.py): self-play world-model data from the current
policy, SFT on it, then RL from the SFT checkpoint with Pass@1 / Pass@k in the evaluations.

  python launch/spa.py --config=configs/frozenlake.py:cpu --workdir=runs/spa
  python launch/spa.py --config=configs/frozenlake.py:cpu --workdir=runs/spa \
      --config.spa.collect_iterations=4 --config.train.iterations=10

config.method is set to "spa" (its defaults: no memory, spa.enabled); --config.<path>=value
overrides as in launch/train.py (command-line keys win over the method's defaults).

Stage A  (<workdir>/spa/) spa.collect_iterations rollouts of rollout.rows_per_iter training rows x
         rollout.group_size episodes with the policy of model.checkpoint, at
         spa.collect_temperature, the world-model answer format requested (explore/spa.py
         WM_INSTRUCTION). Every episode becomes an SFT chat whose assistant turns hold the TRUE
         state before and after the turn (explore/spa.episode_chat); a seeded split by episode
         (spa.val_share) -> spa/wm_train.jsonl, spa/wm_val.jsonl, spa/collect.json.
Stage B  SFT on wm_train with launch/sft.py's loop (config.sft: lr, batch_rows, max_len; steps =
         spa.sft_epochs passes over the rows when > 0, else sft.steps): eval before/after,
         checkpoints in spa/sft/checkpoints, the policy in spa/sft/hf, spa/sft_summary.json; the
         validation chats' answer NLL before and after goes into spa/collect.json.
Stage C  RL in <workdir> as launch/train.py runs it (metrics.jsonl, checkpoints, evaluations with
         eval/pass@1 and eval/pass@k over train.eval_repeats episodes per test row), from
         spa/sft/hf, with the base prompt and the action read from the <answer> span.

Rerunning the command continues: stage A is skipped when its files exist, stage B when spa/sft/hf
exists (else it resumes from its checkpoints), stage C resumes from <workdir>/checkpoints. One run
per workdir (<workdir>/.lock).
"""

import json
import math
import os
import sys
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/spa", "RL here; stages A, B in <workdir>/spa")
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "disable the progress bar")


def collect(trainer, c) -> list:
  """Stage A: the episodes of spa.collect_iterations rollouts in the world-model format."""
  import jax

  from empo2_jax.explore import spa

  episodes = []
  for k in range(c.spa.collect_iterations):
    rows = trainer._rows_for_iteration()
    specs = [(c.env.task, v, g) for g, v in enumerate(rows) for _ in range(c.rollout.group_size)]
    got = trainer.actor.rollout(
      trainer._sampling_params(),
      trainer.model_config,
      specs,
      use_memory=False,
      temperature=c.spa.collect_temperature,
      rng=jax.random.fold_in(trainer.rng, 20_000_000 + k),
      mode="on",
      reflect=False,
      notes=[spa.WM_INSTRUCTION] * len(specs),
    )
    episodes += [e for e in got if not e.env_failed and e.turns]
    print(f"spa collect iteration={k + 1} episodes={len(episodes)}", flush=True)
  return episodes


def to_chats(episodes) -> list:
  from empo2_jax.explore import spa

  cut = [spa.valid_prefix(e.messages, e.states, e.executed) for e in episodes]
  return [spa.episode_chat(*x) for x in cut if x is not None]


def val_loss(trainer, c, chats) -> float:
  """Token-mean answer NLL of `chats` under the trainer's current policy (nan: no chats)."""
  import numpy as np

  from empo2_jax.train import sft
  from empo2_jax.train.sft_loop import _fill

  rows = sft.chat_rows(trainer.tokenizer, chats, c.sft.max_len)
  if not rows:
    return float("nan")
  scfg = sft.SFTConfig(micro_rows=c.sft.micro_rows)
  loss = sft.make_eval_loss(trainer.model_config, scfg)
  total = count = 0.0
  for i in range(0, len(rows), c.sft.batch_rows):
    batch = _fill(sft.pad_rows(rows[i : i + c.sft.batch_rows], trainer.tokenizer.pad_token_id),
                  c.sft.batch_rows)  # fmt: skip
    n = float(np.asarray(batch["loss_mask"])[:, 1:].sum())
    total += float(loss(trainer.state.params, batch)) * n
    count += n
  return total / max(count, 1.0)


def stages_ab(c, spa_dir: str) -> str:
  """Stages A and B in spa_dir; returns the SFT policy's HF directory."""
  from empo2_jax.explore import spa
  from empo2_jax.train.trainer import Trainer
  from empo2_jax.train.sft_loop import run_sft

  hf_dir = os.path.join(spa_dir, "sft", "hf")
  if os.path.exists(os.path.join(hf_dir, "config.json")):
    print(f"spa: SFT policy found in {hf_dir}; stages A and B skipped", flush=True)
    return hf_dir
  trainer = Trainer(c, spa_dir, progress=False)
  try:
    paths = [os.path.join(spa_dir, f"wm_{s}.jsonl") for s in ("train", "val")]
    info_path = os.path.join(spa_dir, "collect.json")
    if all(os.path.exists(p) for p in paths + [info_path]):
      train, val = ([json.loads(x) for x in open(p) if x.strip()] for p in paths)
      with open(info_path) as f:
        info = json.load(f)
    else:
      episodes = collect(trainer, c)
      chats = to_chats(episodes)
      tr, va = spa.split(len(chats), c.spa.val_share, c.seed)
      train, val = [chats[i] for i in tr], [chats[i] for i in va]
      turns = [t for e in episodes for t in e.turns]
      info = {
        "episodes": len(episodes),
        "turns": len(turns),
        "success": sum(e.success for e in episodes) / max(len(episodes), 1),
        "return_mean": sum(e.score for e in episodes) / max(len(episodes), 1),
        "wm_format_frac": sum(spa.parse_wm(t.response) is not None for t in turns)
        / max(len(turns), 1),
        "train_chats": len(train),
        "val_chats": len(val),
      }
      for p, data in zip(paths, (train, val)):
        with open(p, "w") as f:
          f.writelines(json.dumps(x) + "\n" for x in data)
    if not train:
      sys.exit("error: SPA collected no episode to train on; raise spa.collect_iterations")
    info["val_loss_before"] = val_loss(trainer, c, val)
    sft_c = c
    if c.spa.sft_epochs > 0:  # SPA trains epochs over its data
      sft_c = c.copy_and_resolve_references()
      from empo2_jax.train import sft

      n_rows = len(sft.chat_rows(trainer.tokenizer, train, c.sft.max_len))
      sft_c.sft.steps = max(1, math.ceil(c.spa.sft_epochs * n_rows / c.sft.batch_rows))
    summary = run_sft(sft_c, spa_dir, trainer, train)
    info["val_loss_after"] = val_loss(trainer, c, val)
    info["sft_steps"] = int(sft_c.sft.steps)
    info["sft_loss_first"], info["sft_loss_last"] = summary["loss_first"], summary["loss_last"]
    with open(info_path, "w") as f:
      json.dump(info, f, indent=1)
    print(
      "spa data "
      + " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()
      ),  # fmt: skip
      flush=True,
    )
  finally:
    trainer.close()
  return hf_dir


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from empo2_jax.train import build, methods, workdir_lock

  c = _CONFIG.value
  keep = methods.explicit_keys(sys.argv[1:])
  if "method" not in keep:
    c.method = "spa"
  methods.apply(c, keep=keep)
  if not c.spa.enabled:
    sys.exit(f"error: method={c.method!r} does not enable SPA (spa.enabled); use method=spa")
  try:
    build.check_config(c)
  except build.ConfigError as e:
    sys.exit(f"error: {e}")
  workdir = os.path.abspath(_WORKDIR.value)
  try:
    lock = workdir_lock.WorkdirLock(workdir).acquire()
  except workdir_lock.WorkdirBusy as e:
    sys.exit(f"error: {e}")
  with lock:
    hf_dir = stages_ab(c, os.path.join(workdir, "spa"))
    rl = c.copy_and_resolve_references()
    rl.model.checkpoint, rl.model.random_init, rl.model.tokenizer = hf_dir, False, ""
    _rl(rl, workdir)


def _rl(c, workdir: str) -> None:
  """Stage C, as launch/train.py runs a training (resume, run, summary)."""
  from empo2_jax.train import checkpoint as ckpt_lib
  from empo2_jax.train import faults
  from empo2_jax.train.trainer import Trainer

  trainer = Trainer(c, workdir, progress=not _NO_PROGRESS.value)
  try:
    step = trainer.resume()
  except RuntimeError as e:
    trainer.close()
    sys.exit(f"error: {e}")
  if step is not None:
    print(f"spa: RL resumed at iteration {step}", flush=True)
  try:
    history = trainer.run()
  except (faults.NonFiniteError, faults.WriteError, ckpt_lib.CheckpointSaveError) as e:
    sys.exit(f"error: {e}")
  if history:
    last = history[-1]
    keys = ("return_mean", "success", "eval/return_mean", "eval/success", "eval/pass@k")
    print(
      f"done iterations={len(history)} workdir={workdir} "
      + " ".join(f"{k}={last[k]:.4g}" for k in keys if k in last),
      flush=True,
    )


if __name__ == "__main__":
  app.run(main)
