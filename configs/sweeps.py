"""Ablation sweeps (big_vision's get_hyper idea): each sweep is a list of runs, a run a dict of
config overrides (`path: value`, paths below the config root) plus an optional `name`.

  python launch/sweep.py --config=configs/sciworld.py:cpu --sweep=configs/sweeps.py:pq \
      --workdir=runs/pq --print_commands          # one launch/train.py command per run
  python launch/sweep.py ... --sweep=configs/sweeps.py:methods    # run them one after another

Build runs with `sweep` (one key, many values), `product` (every combination) and `zip_`
(element-wise); `fixed` adds the same overrides to every run.
"""

import itertools


def sweep(key: str, values) -> list[dict]:
  return [{key: v} for v in values]


def product(*sweeps) -> list[dict]:
  return [dict(kv for d in combo for kv in d.items()) for combo in itertools.product(*sweeps)]


def zip_(*sweeps) -> list[dict]:
  lengths = {len(s) for s in sweeps}
  if len(lengths) != 1:
    raise ValueError(f"zip_ needs sweeps of one length, got lengths {sorted(lengths)}")
  return [dict(kv for d in combo for kv in d.items()) for combo in zip(*sweeps)]


def fixed(runs: list[dict], **overrides) -> list[dict]:
  extra = {k.replace("__", "."): v for k, v in overrides.items()}
  return [{**extra, **r} for r in runs]


def named(name: str, **overrides) -> dict:
  return {"name": name, **{k.replace("__", "."): v for k, v in overrides.items()}}


# ---------------------------------------------------------------------------------------------
# table1: the paper's Table 1 (+ the GiGPO column): every method x task, each run in
# <root>/<task>/<method>, then launch/table.py over <root>.
#   python configs/sweeps.py table1 --root=runs/table1            # the 18 tasks (a cluster's list)
#   python configs/sweeps.py table1_cpu --root=runs/table1_cpu    # 2 tasks, sized for a 2-core CPU
# print the commands, one a line, in an order that runs as a script (Retrospex trains on the
# episodes its task's GRPO run saved). launch/sweep.py --sweep=configs/sweeps.py:table1 runs only
# the training methods' runs.
TABLE1_METHODS = ("naive", "reflexion", "grpo", "gigpo", "empo2", "retrospex")
TABLE1_CPU_TASKS = ("find-animal", "power-component")
# The CPU version: the embedded SmolLM2-135M (configs/sciworld.py:cpu: 2 variations x 2 rollouts,
# 4 steps, 2 test variations x 1), one training iteration, the evaluation by launch/eval.py.
# Full remat: without it the update of the cpu config peaked near 9 GB here.
TABLE1_CPU_TRAIN = (
  "--config.train.iterations=1 --config.train.eval_every=0 --config.train.eval_at_end=False "
  "--config.train.checkpoint_every=1 --config.model.remat=full"
)
TABLE1_CPU_REFLEXION = "--trials=3 --reflections=3 --reflection_tokens=48"
TABLE1_CPU_RETROSPEX = "--steps=200 --batch=32"


def _paper_tasks():
  from empo2_jax.envs.scienceworld.env import PAPER_TASKS  # no JVM starts on import

  return PAPER_TASKS


def table1_runs(tasks, cpu: bool = False) -> list[dict]:
  """The training methods' runs of table1 (launch/sweep.py): name <method>_<task>."""
  from empo2_jax import methods

  runs = []
  for task in tasks:
    for m in TABLE1_METHODS:
      if methods.get(m).trains:
        run = named(f"{m}_{task}", method=m, env__task=task, train__save_episodes=m == "grpo")
        if cpu:
          run.update({"train.iterations": 1, "train.eval_every": 0, "train.eval_at_end": False})
        runs.append(run)
  return runs


def table1_commands(
  root: str,
  cpu: bool = False,
  tasks=None,
  config: str = "",
  python: str = "python",
  extra: str | None = None,
) -> list[str]:
  """Every command of table1, in run order (see above), the table last. `extra` is added to every
  run's command line (default for the full version: the Qwen2.5-7B-Instruct directory as the
  shell variable $QWEN; for the CPU version: one env worker)."""
  import os

  from empo2_jax import cli, methods

  tasks = tuple(tasks or (TABLE1_CPU_TASKS if cpu else _paper_tasks()))
  if extra is None:  # CPU: one env worker (one JVM), to fit beside other jobs on a shared machine
    extra = "--config.env.workers=1" if cpu else '--config.model.checkpoint="$QWEN"'
  lines = []
  for task in tasks:
    spec = config or f"configs/sciworld.py:{'cpu,' if cpu else ''}task={task}"
    for m in TABLE1_METHODS:
      work = os.path.join(root, task, m)
      episodes = os.path.join(root, task, "grpo")  # Retrospex's critic learns from these
      for line in cli.command_lines(methods.get(m), spec, work, python, True, episodes):
        args = [extra] if extra else []
        if "launch/train.py" in line:
          args.append("--no_progress")
          args += [TABLE1_CPU_TRAIN] if cpu else []
          args += ["--config.train.save_episodes=True"] if m == "grpo" else []
        elif "--method=reflexion" in line and cpu:
          args.append(TABLE1_CPU_REFLEXION)
        elif "retrospex.py train" in line and cpu:
          args.append(TABLE1_CPU_RETROSPEX)
        lines.append(" ".join([line] + args))
  lines.append(f"{python} launch/table.py --runs={root} --out={os.path.join(root, 'table')}")
  return lines


def get_sweep(arg: str) -> list[dict]:
  sweeps = {
    # memory probability p x off-policy share q (docs/method.md §1; the paper's ablation grid)
    "pq": lambda: product(
      sweep("empo2.p_memory", [0.1, 0.25, 0.5]), sweep("empo2.q_offpolicy", [1 / 3, 2 / 3])
    ),
    # the low-probability mask threshold delta (docs/method.md §5); 0 disables the mask
    "delta": lambda: (
      sweep("loss.low_prob_delta", [-3.0, -5.0, -10.0])
      + [named("no_mask", loss__low_prob_mask=False)]
    ),
    # scale of the intrinsic memory reward, 0 = none
    "intrinsic": lambda: sweep("empo2.intrinsic_scale", [0.0, 0.5, 1.0, 2.0]),
    # EMPO2 vs GRPO (no memory) vs its two halves (the paper's Figure 1a / 9 comparison)
    "methods": lambda: [
      named("empo2"),
      named("grpo", empo2__p_memory=0.0),
      named("online_tips_only", empo2__q_offpolicy=0.0),
      named("offline_only", empo2__q_offpolicy=1.0),
    ],
    # docs/results.md: from one SFT checkpoint and the same number of env steps, GRPO (no
    # memory), EMPO2 with the paper's p, q, and EMPO2 with a larger memory share.
    "learning": lambda: [
      named("grpo", empo2__p_memory=0.0),
      named("empo2", empo2__p_memory=0.25, empo2__q_offpolicy=2.0 / 3.0),
      named("empo2_p50", empo2__p_memory=0.5, empo2__q_offpolicy=2.0 / 3.0),
    ],
    # four small runs of the tiny config (tests, the README figure)
    "tiny4": lambda: fixed(
      product(sweep("empo2.p_memory", [0.0, 0.5]), sweep("empo2.q_offpolicy", [0.0, 1.0])),
      train__iterations=2,
    ),
    # two of them, GRPO and EMPO2 (the real sweep-then-plot test)
    "tiny2": lambda: fixed(
      sweep("empo2.p_memory", [0.0, 0.5]), empo2__q_offpolicy=0.5, train__iterations=2
    ),
    # the exploration methods side by side on one environment (the config given to
    # launch/sweep.py, e.g. configs/frozenlake.py:cpu) with the same budget (iterations, variations,
    # group size, evaluation); SPA adds its self-play collection and SFT before its RL
    # (launch/spa.py). docs/exploration_cpu.md has the CPU run.
    "exploration": lambda: [
      named(m, method=m) for m in ("grpo", "empo2", "sge", "herl", "spa", "empo2_rnd")
    ],
    # the training methods of the paper's Table 1 (table1_commands has every method)
    "table1": lambda: table1_runs(_paper_tasks()),
    # the same sized for a 2-core CPU: 2 tasks, one training iteration each (docs/table1_cpu.md)
    "table1_cpu": lambda: table1_runs(TABLE1_CPU_TASKS, cpu=True),
  }
  if arg not in sweeps:
    raise ValueError(f"unknown sweep {arg!r}; valid: {', '.join(sorted(sweeps))}")
  return sweeps[arg]()


if __name__ == "__main__":  # python configs/sweeps.py table1|table1_cpu [--root=DIR] [--python=PY]
  import argparse

  ap = argparse.ArgumentParser(description="print the commands of a multi-entry-point sweep")
  ap.add_argument("sweep", choices=["table1", "table1_cpu"])
  ap.add_argument("--root", default="", help="run root (default: runs/<sweep>)")
  ap.add_argument("--python", default="python", help="interpreter in the printed commands")
  ap.add_argument("--config", default="", help="config spec for every run (default: per task)")
  a = ap.parse_args()
  cmds = table1_commands(
    a.root or f"runs/{a.sweep}", cpu=a.sweep == "table1_cpu", config=a.config, python=a.python
  )
  print("\n".join(cmds))
