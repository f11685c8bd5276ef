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


def get_sweep(arg: str) -> list[dict]:
  sweeps = {
    # memory probability p x off-policy share q (SPEC §1; the paper's ablation grid)
    "pq": lambda: product(
      sweep("empo2.p_memory", [0.1, 0.25, 0.5]), sweep("empo2.q_offpolicy", [1 / 3, 2 / 3])
    ),
    # the low-probability mask threshold delta (SPEC §4); 0 disables the mask
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
  }
  if arg not in sweeps:
    raise ValueError(f"unknown sweep {arg!r}; valid: {', '.join(sorted(sweeps))}")
  return sweeps[arg]()
