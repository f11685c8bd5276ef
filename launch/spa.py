"""SPA (docs/methods.md §7; empo2_jax/methods/spa.py): self-play world-model data from the current
policy, SFT on it, then RL from the SFT checkpoint with Pass@1 / Pass@k in the evaluations.

  python launch/spa.py --config=configs/frozenlake.py:cpu --workdir=runs/spa
  python launch/spa.py --config=configs/frozenlake.py:cpu --workdir=runs/spa \
      --config.spa.collect_iterations=4 --config.train.iterations=10

config.method is set to "spa" (its defaults: no memory, spa.enabled); --config.<path>=value
overrides as in launch/train.py (command-line keys win over the method's defaults).

Stage A  (<workdir>/spa/) spa.collect_iterations rollouts of rollout.variations_per_iter training
         variations x rollout.group_size episodes with the policy of model.checkpoint, at
         spa.collect_temperature, the world-model answer format requested (methods/spa.py
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
per workdir (<workdir>/.lock). The workdir may be gs:// (as for launch/train.py; needs gcsfs): every
stage's files go there, nothing is written locally but temporary copies.
"""

import sys
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  "workdir", "runs/spa", "RL here; stages A, B in <workdir>/spa (local or gs://)"
)
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "disable the progress bar")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from empo2_jax import remote
  from empo2_jax import methods
  from empo2_jax.train import build, workdir_lock

  c = _CONFIG.value
  keep = cli.explicit_keys(sys.argv[1:])
  if "method" not in keep:
    c.method = "spa"
  methods.apply(c, keep=keep)
  if not c.spa.enabled:
    sys.exit(f"error: method={c.method!r} does not enable SPA (spa.enabled); use method=spa")
  try:
    build.check_config(c)
  except build.ConfigError as e:
    cli.fail(e)  # one line, exit 2
  workdir = remote.absolute(_WORKDIR.value).rstrip("/")  # gs:// kept as it is
  try:
    lock = workdir_lock.WorkdirLock(workdir).acquire()
  except workdir_lock.WorkdirBusy as e:
    sys.exit(f"error: {e}")
  with lock:
    from empo2_jax.train.spa_run import stages_ab

    hf_dir = stages_ab(c, f"{workdir}/spa")
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


def _check_workdir(flag_values) -> None:
  """gs:// without gcsfs or credentials: one line before anything starts (data/storage.py)."""
  from empo2_jax.data.storage import check_gcs_access

  check_gcs_access(flag_values.workdir, "--workdir")


if __name__ == "__main__":
  # one-line errors for config, checkpoint and path mistakes (exit 2)
  cli.run(main, checks=(_check_workdir,))
