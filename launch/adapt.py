"""Out-of-distribution adaptation with memory only (the paper's Figure 8): trained policies on a
task they never trained on, K trials, tips written after every trial and read in the next, no
weight updates.

  python launch/adapt.py --config=configs/sciworld.py:cpu --workdir=runs/empo2,runs/grpo \
      --task=find-plant --trials=10 [--labels=EMPO2,GRPO] [--out=docs/adapt]

For each run in --workdir (comma-separated): the newest checkpoint's policy (the config's initial
policy, with a warning, where there is none), an EMPTY memory (the run's memories belong to its
own task; --keep_memory keeps them), the --task's test variations (config.env.num_test_variations),
trials at train.eval_temperature (empo2_jax/baselines/adapt.py). Prints the return per trial and
writes <out>/adapt.json and <out>/adapt.png (return per trial, one line per run; default --out:
<first workdir>/adapt_<task>). The weights are checked bit-identical before and after.
"""

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from etils import epath  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "trained run(s), comma-separated", required=True)
_TASK = flags.DEFINE_string("task", None, "the unseen task", required=True)
_TRIALS = flags.DEFINE_integer("trials", 10, "trials (memory written after each)")
_LABELS = flags.DEFINE_string("labels", "", "comma-separated legend labels (default: run names)")
_OUT = flags.DEFINE_string("out", "", "output directory (default: <first workdir>/adapt_<task>)")
_KEEP_MEMORY = flags.DEFINE_bool("keep_memory", False, "start from the run's own memory")


def _fingerprint(params) -> str:
  import hashlib

  import jax
  import numpy as np

  h = hashlib.sha256()
  for x in jax.tree.leaves(params):
    h.update(np.asarray(x).tobytes())
  return h.hexdigest()


def adapt_run(config, workdir: str) -> dict:
  """Adaptation records of one trained run (see the module docstring)."""
  import jax

  from empo2_jax.baselines.adapt import adapt
  from empo2_jax.memory.store import MemoryStore
  from empo2_jax.train.trainer import Trainer

  trainer = Trainer(config, workdir, progress=False)
  try:
    step = trainer.resume(read_only=True)
    if step is None:
      print(f"warning: no checkpoint in {workdir}; the initial policy", file=sys.stderr)
    if not _KEEP_MEMORY.value:
      enc = trainer.memory.encoder
      trainer.memory.replace_store(MemoryStore(dim=enc.dim, max_per_slot=config.memory.max_entries))
    params = trainer.sampling_params()
    before = _fingerprint(params)
    records = adapt(
      trainer.actor,
      params,
      trainer.model_config,
      config.env.task,
      trainer.test_variations,
      _TRIALS.value,
      temperature=config.train.eval_temperature,
      rng=jax.random.fold_in(trainer.rng, 30_000_000),
      memory_fallback=config.memory.unseen_fallback == "task",
    )
    if _fingerprint(params) != before or _fingerprint(trainer.sampling_params()) != before:
      raise RuntimeError("the policy's weights changed during adaptation")
    return {"workdir": workdir, "checkpoint": step, "params_sha256": before, "trials": records}
  finally:
    trainer.close()


def plot(runs: dict, task: str, path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for (label, run), marker in zip(runs.items(), "osD^v"):
    x = [r["trial"] for r in run["trials"]]
    y = [r["return_mean"] for r in run["trials"]]
    ax.plot(x, y, marker=marker, label=label)
  ax.set_xlabel("trial (memory from the earlier trials, no weight updates)")
  ax.set_ylabel("return")
  ax.set_title(f"adaptation to an unseen task: {task}")
  ax.set_xticks(range(1, max(len(r["trials"]) for r in runs.values()) + 1))
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  with epath.Path(path).open("wb") as f:
    fig.savefig(f, format="png", dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from empo2_jax import methods
  from empo2_jax.train.build import ConfigError

  config = _CONFIG.value
  methods.apply(config, keep=cli.explicit_keys(sys.argv[1:]))
  config.env.task = _TASK.value
  workdirs = [w for w in _WORKDIR.value.split(",") if w]
  labels = [x for x in _LABELS.value.split(",") if x] or [
    os.path.basename(w.rstrip("/")) for w in workdirs
  ]
  if len(labels) != len(workdirs):
    sys.exit(f"error: {len(labels)} labels for {len(workdirs)} workdirs")
  runs = {}
  for label, w in zip(labels, workdirs):
    try:
      runs[label] = adapt_run(config, w)
    except ConfigError as e:
      cli.fail(e)  # one line, exit 2
    for r in runs[label]["trials"]:
      print(
        f"{label} trial {r['trial']}: return {r['return_mean']:.1f} ± {r['return_std']:.1f} "
        f"success {100 * r['success']:.0f}% memory {r['memory_before']} -> {r['memory_after']} "
        f"tips/step {r['retrieved_per_step']:.2f}",
        flush=True,
      )
  out = epath.Path(_OUT.value or os.path.join(workdirs[0], f"adapt_{_TASK.value}"))
  out.mkdir(parents=True, exist_ok=True)
  (out / "adapt.json").write_text(json.dumps({"task": _TASK.value, "runs": runs}, indent=1))
  plot(runs, _TASK.value, out / "adapt.png")
  print(f"wrote {out / 'adapt.json'} and {out / 'adapt.png'}")


if __name__ == "__main__":
  cli.run(main)  # one-line errors for config, checkpoint and path mistakes (exit 2)
