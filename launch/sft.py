"""Behaviour cloning on gold trajectories before RL (the warm start of a small model).

  python launch/sft.py --config=configs/sciworld.py:learn --workdir=runs/sft
  python launch/train.py --config=configs/sciworld.py:learn --config.model.checkpoint=runs/sft/hf

Gold action sequences of the task's TRAIN variations (config.sft.variations of them, 0: all) are
replayed in ScienceWorld and rendered through exactly the actor's chat (same prompts, same chat
template, no tips); the loss is the token-mean NLL of the assistant answers (train/sft.py). The test
variations are evaluated without memory before and after, as `launch/train.py` evaluates. Prints

  sft loss_first=... loss_last=...          (answer NLL over all gold rows, before / after)
  sft eval_return_before=... eval_return_after=... eval_success_before=... eval_success_after=...

and writes <workdir>/sft_metrics.jsonl, orbax checkpoints in <workdir>/sft/checkpoints (rerunning
the command resumes from the newest) and the trained policy as a Hugging Face directory
<workdir>/sft/hf that `launch/train.py --config.model.checkpoint=DIR` loads.
"""

import sys
import time
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli, remote  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/sft", "where metrics, checkpoints and hf/ go")


def _gold_chats(c, materials):
  """Gold chats of the configured train variations (successful replays only)."""
  import dataclasses
  from empo2_jax.envs import fewshot
  from empo2_jax.envs.scienceworld import SciWorldEnv
  from empo2_jax.train import build
  from empo2_jax.train import sft

  env_cfg = build.env_config(c)
  max_turns = env_cfg.max_steps(c.env.task)
  shots = next(iter(materials.values())).few_shot
  env = SciWorldEnv(dataclasses.replace(env_cfg, default_max_steps=1000, max_steps_overrides=()))
  try:
    train = env.variations(c.env.task, "train")
    chosen = train[: c.sft.variations] if c.sft.variations else train
    chats = []
    for v in chosen:
      traj = fewshot.replay_gold(env, c.env.task, v)
      if traj.final_score <= env_cfg.success_score:
        continue
      material = fewshot.prompt_material(env, c.env.task, v, shots)
      chats.append(sft.gold_chat(material, traj, max_turns=max_turns))
  finally:
    env.close()
  return chats


def main(argv):
  from empo2_jax.train import workdir_lock

  try:  # one run per workdir: a second one (SFT or RL) fails here, naming the first
    lock = workdir_lock.WorkdirLock(remote.absolute(_WORKDIR.value)).acquire()
  except workdir_lock.WorkdirBusy as e:
    sys.exit(f"error: {e}")
  with lock:  # released on exit, also on an error
    _sft(argv)


def _sft(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from empo2_jax.train.build import ConfigError
  from empo2_jax.train.trainer import Trainer

  c, workdir = _CONFIG.value, remote.absolute(_WORKDIR.value)  # gs:// stays gs://
  try:
    trainer = Trainer(c, workdir, progress=False)
  except ConfigError as e:
    cli.fail(e)  # one line, exit 2
  try:
    t0 = time.perf_counter()
    chats = _gold_chats(c, trainer.actor.materials)
    from empo2_jax.train.sft_loop import run_sft

    run_sft(c, workdir, trainer, chats, t0)
  finally:
    trainer.close()


if __name__ == "__main__":
  cli.run(main)  # one-line errors for config, checkpoint and path mistakes (exit 2)
