"""Evaluate a run's latest checkpoint on its task's test variations: the paper's Table 1 shape.

  python launch/eval.py --config=configs/sciworld.py:cpu --workdir=runs/cpu [--memory=both]

Uses the same --config (and overrides) as training. Loads the newest restorable checkpoint of
--workdir (or the config's initial policy if there is none, with a warning), runs
test variations x train.eval_repeats episodes at train.eval_temperature, without memory, with the
run's memory, or both, and prints a markdown table (per task: return mean ± std, success rate).
The table is also written to <workdir>/eval/table.md and table.csv (through etils.epath: the
workdir may be gs://).
"""

import sys
import warnings

# ScienceWorld starts its JVM with fork+exec; Python warns about fork in a threaded process, which
# does not apply to an immediate exec.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import app, flags, logging  # noqa: E402
from etils import epath  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "the training run's workdir", required=True)
_MEMORY = flags.DEFINE_enum(
  "memory",
  "without",
  ["without", "with", "both"],
  "evaluate without the run's memory (the paper's number), with it, or both",
)


def write_tables(workdir, rows: list[dict]) -> str:
  """<workdir>/eval/table.md and table.csv from evaluate.summarize rows; returns the markdown."""
  from empo2_jax.train import evaluate

  out_dir = epath.Path(workdir) / "eval"
  out_dir.mkdir(parents=True, exist_ok=True)
  md = evaluate.table_markdown(rows)
  (out_dir / "table.md").write_text(md)
  (out_dir / "table.csv").write_text(evaluate.table_csv(rows))
  return md


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # keep orbax's INFO lines out of the way
    logging.set_verbosity(logging.WARNING)
  from empo2_jax.train import evaluate
  from empo2_jax.train.build import ConfigError
  from empo2_jax.train.trainer import Trainer

  config = _CONFIG.value
  try:
    trainer = Trainer(config, _WORKDIR.value, progress=False)
  except ConfigError as e:
    sys.exit(f"error: {e}")
  try:
    try:
      step = trainer.resume(read_only=True)
    except RuntimeError as e:  # checkpoints there, none restorable
      sys.exit(f"error: {e}")
    if step is None:
      print(
        f"warning: no checkpoint in {_WORKDIR.value}; evaluating the initial policy",
        file=sys.stderr,
      )
    settings = {"without": [False], "with": [True], "both": [False, True]}[_MEMORY.value]
    rows = []
    for with_memory in settings:
      episodes = trainer.eval_episodes(with_memory)
      rows.append(
        evaluate.summarize(
          config.env.task,
          "with memory" if with_memory else "no memory",
          [e.episode_return for e in episodes],
          [e.success for e in episodes],
        )
      )
  finally:
    trainer.close()
  md = write_tables(_WORKDIR.value, evaluate.with_average(rows))
  print(f"iteration {trainer.iteration} of {_WORKDIR.value}")
  print(md, end="")


if __name__ == "__main__":
  app.run(main)
