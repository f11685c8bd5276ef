"""Behaviour cloning on gold trajectories before RL (the warm start of a small model).

  python launch/sft.py --config=configs/sciworld.py:learn --workdir=runs/sft
  python launch/train.py --config=configs/sciworld.py:learn --config.model.checkpoint=runs/sft/hf

Gold action sequences of TRAIN variations (config.sft.variations of each task, 0: all) are
replayed in ScienceWorld and rendered through exactly the actor's chat (same prompts, same chat
template, no tips); the loss is the token-mean NLL of the assistant answers (train/sft.py). The test
variations are evaluated without memory before and after, as `launch/train.py` evaluates.

Which tasks (config.sft.tasks, train/sft_gold.py): "" clones the target task config.env.task; a
comma-separated list of OTHER tasks is a format-only warm start (the action format without the
target's gold paths; listing the target is an error):

  python launch/sft.py --config=configs/sciworld.py:learn,format --workdir=runs/sft_format

Prints

  sft gold TASK=N ... target=TASK          (successful gold episodes per task)
  sft loss_first=... loss_last=...          (answer NLL over all gold rows, before / after)
  sft eval_return_before=... eval_return_after=... eval_success_before=... eval_success_after=...

and writes <workdir>/sft_data.json (target, tasks, the (task, variation) of every gold episode),
<workdir>/sft_metrics.jsonl, orbax checkpoints in <workdir>/sft/checkpoints (rerunning
the command resumes from the newest) and the trained policy as a Hugging Face directory
<workdir>/sft/hf that `launch/train.py --config.model.checkpoint=DIR` loads.
"""

import sys
import time
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from etils import epath  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli, remote  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/sft", "where metrics, checkpoints and hf/ go")


def _gold_chats(c, workdir):
  """Gold chats of the SFT tasks' train variations (successful replays only; train/sft_gold.py);
  which (task, variation) each came from goes to <workdir>/sft_data.json."""
  import collections
  import json
  from empo2_jax.envs.scienceworld.env import ALL_TASKS
  from empo2_jax.train import build
  from empo2_jax.train import sft_gold

  tasks = sft_gold.sft_tasks(c.sft.tasks, c.env.task, ALL_TASKS)
  env_cfg = build.env_config(c)
  env = sft_gold.gold_env(env_cfg)  # gold paths to their end, as written
  try:
    chats = sft_gold.gold_chats(
      env,
      tasks,
      variations=c.sft.variations,
      max_turns=env_cfg.max_steps(c.env.task),  # the agent's step limit on the target task
      n_few_shot=c.env.few_shot,
      success_score=env_cfg.success_score,
    )
  finally:
    env.close()
  counts = collections.Counter(g.task for g in chats)
  print(
    "sft gold " + " ".join(f"{t}={counts[t]}" for t in tasks) + f" target={c.env.task}",
    flush=True,
  )
  data = {
    "target": c.env.task,
    "tasks": list(tasks),
    "episodes": [[g.task, g.variation] for g in chats],
  }
  (epath.Path(workdir) / "sft_data.json").write_text(json.dumps(data, indent=1))  # local or gs://
  return [g.messages for g in chats]


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
  from empo2_jax.envs.scienceworld.env import ALL_TASKS
  from empo2_jax.train.sft_gold import sft_tasks

  try:  # a bad task list fails before any model loads
    sft_tasks(c.sft.tasks, c.env.task, ALL_TASKS)
  except ValueError as e:
    cli.fail(e)  # one line, exit 2
  try:
    trainer = Trainer(c, workdir, progress=False)
  except ConfigError as e:
    cli.fail(e)  # one line, exit 2
  try:
    t0 = time.perf_counter()
    chats = _gold_chats(c, workdir)
    from empo2_jax.train.sft_loop import run_sft

    run_sft(c, workdir, trainer, chats, t0)
  finally:
    trainer.close()


if __name__ == "__main__":
  cli.run(main)  # one-line errors for config, checkpoint and path mistakes (exit 2)
