"""Arms against a baseline over seeds: the exploration experiment's report (launch/compare.py).

Input: evaluation records (baselines/results.py's result.json) that carry `method` (the arm's
label), `seed`, `variations` and per-episode `returns` / `successes`, one record per arm and
seed, all on the same test variations.

  arm_summary(records)                 per arm: mean ± s.e. over the seeds' mean returns
  paired_differences(records, "grpo")  per arm: arm - baseline, paired by (seed, variation)
  tip_usage(episode_records)           a training run's tips: how often shown, what they said

Two 95% intervals for each paired difference, because they answer different questions:
- over pairs: the t-interval of the seeds x variations differences. It treats the pairs as
  independent, which they are not within a seed (one trained model per seed), so it is the
  narrow one: variation-to-variation noise only.
- over seeds: the t-interval of the per-seed mean differences (n = seeds, n - 1 degrees of
  freedom). Run-to-run variance included; with 3 seeds its t quantile is 4.30, so it is wide.
A difference is called real here only when the seed interval excludes 0.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


def _check(records: Sequence[dict]) -> None:
  seen = set()
  for r in records:
    for key in ("method", "seed", "variations", "returns"):
      if key not in r:
        raise ValueError(
          f"evaluation record {r.get('workdir', '?')} has no {key!r}: evaluate with launch/eval.py "
          "(it records method, seed and variations)"
        )
    if len(r["variations"]) != len(r["returns"]):
      raise ValueError(
        f"{r.get('workdir', '?')}: {len(r['variations'])} variations for "
        f"{len(r['returns'])} returns (compare needs one episode per variation: eval_repeats=1)"
      )
    key = (r["method"], int(r["seed"]))
    if key in seen:
      raise ValueError(f"two evaluations of {key[0]} seed {key[1]}: pass one iteration's runs")
    seen.add(key)


def t_interval(x: Iterable[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
  """(mean, low, high): the two-sided t-interval of the mean of `x` (nan bounds for n < 2)."""
  a = np.asarray(list(x), np.float64)
  if a.size == 0:
    raise ValueError("no values")
  m = float(a.mean())
  if a.size < 2:
    return m, math.nan, math.nan
  half = float(stats.t.ppf(0.5 + confidence / 2, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size))
  return m, m - half, m + half


def _by_arm(records: Sequence[dict]) -> dict[str, dict[int, dict]]:
  out: dict[str, dict[int, dict]] = collections.defaultdict(dict)
  for r in records:
    out[r["method"]][int(r["seed"])] = r
  return {arm: dict(sorted(seeds.items())) for arm, seeds in out.items()}


def _se(a: np.ndarray) -> float:
  return float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan


def arm_summary(records: Sequence[dict]) -> list[dict]:
  """Per arm, in first-seen order: seeds, mean ± s.e. (ddof 1) over the seeds' mean returns and
  success rates, and the per-seed means."""
  _check(records)
  rows = []
  for arm, seeds in _by_arm(records).items():
    means = np.array([np.mean(r["returns"]) for r in seeds.values()], np.float64)
    succ = np.array([np.mean(r.get("successes", [])) for r in seeds.values()], np.float64)
    n = means.size
    rows.append(
      {
        "arm": arm,
        "seeds": n,
        "episodes": int(sum(len(r["returns"]) for r in seeds.values())),
        "return_mean": float(means.mean()),
        "return_se": _se(means),
        "success_mean": float(succ.mean()),
        "success_se": _se(succ),
        "seed_means": [float(x) for x in means],
      }
    )
  return rows


def paired_differences(records: Sequence[dict], baseline: str) -> list[dict]:
  """Per arm other than `baseline`: its return minus the baseline's on the same seed and test
  variation. Only (seed, variation) pairs both evaluated count; an arm sharing no seed with the
  baseline is an error. Fields: pairs, seeds, mean, the pairs' and the seeds' 95% intervals,
  and wins / ties / losses over the pairs."""
  _check(records)
  arms = _by_arm(records)
  if baseline not in arms:
    raise ValueError(f"no evaluation of the baseline {baseline!r}; arms: {sorted(arms)}")
  base = {s: dict(zip(map(int, r["variations"]), r["returns"])) for s, r in arms[baseline].items()}
  rows = []
  for arm, seeds in arms.items():
    if arm == baseline:
      continue
    diffs, per_seed = [], []
    for s, r in seeds.items():
      if s not in base:
        continue
      d = [x - base[s][int(v)] for v, x in zip(r["variations"], r["returns"]) if int(v) in base[s]]
      if d:
        diffs += d
        per_seed.append(float(np.mean(d)))
    if not diffs:
      raise ValueError(f"{arm} shares no (seed, variation) with {baseline}")
    mean, lo, hi = t_interval(diffs)
    _, slo, shi = t_interval(per_seed)
    d = np.asarray(diffs)
    rows.append(
      {
        "arm": arm,
        "baseline": baseline,
        "pairs": int(d.size),
        "seeds": len(per_seed),
        "mean": mean,
        "pairs_low": lo,
        "pairs_high": hi,
        "seeds_low": slo,
        "seeds_high": shi,
        "seed_means": per_seed,
        "wins": int((d > 0).sum()),
        "ties": int((d == 0).sum()),
        "losses": int((d < 0).sum()),
      }
    )
  return rows


def tip_usage(episodes: Sequence[dict], samples: int = 3) -> dict:
  """How a run used its memory, from its saved episodes (data/trajectories.episode_record):
  memory episodes (rolled out with memory), their steps and the share of those steps that showed
  at least one tip, the tips written (non-empty), and up to `samples` distinct tips written and
  shown, the latest first."""
  mem = [e for e in episodes if e["use_memory"]]
  steps = sum(len(e["turns"]["num_tips"]) for e in mem)
  shown_steps = sum(sum(1 for n in e["turns"]["num_tips"] if n > 0) for e in mem)

  def distinct(texts):
    return list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))[:samples]

  latest = sorted(episodes, key=lambda e: -int(e["iteration"]))
  return {
    "episodes": len(episodes),
    "memory_episodes": len(mem),
    "memory_steps": steps,
    "steps_with_tips": shown_steps,
    "share_with_tips": shown_steps / steps if steps else math.nan,
    "tips_written": sum(1 for e in episodes if (e.get("tip") or "").strip()),
    "written": distinct(e.get("tip") for e in latest),
    "shown": distinct(t for e in latest for t in e.get("tips", [])),
  }


def _num(x: float, fmt: str = ".1f") -> str:
  return "n/a" if math.isnan(x) else format(x, fmt)


def report_markdown(summary: Sequence[dict], paired: Sequence[dict]) -> str:
  """The two tables as markdown."""
  lines = [
    "| arm | seeds | return (mean ± s.e. over seeds) | success | per seed |",
    "|---|---|---|---|---|",
  ]
  for r in summary:
    per_seed = ", ".join(f"{x:.1f}" for x in r["seed_means"])
    lines.append(
      f"| {r['arm']} | {r['seeds']} | {r['return_mean']:.1f} ± {_num(r['return_se'])} | "
      f"{100 * r['success_mean']:.1f}% ± {_num(100 * r['success_se'])} | {per_seed} |"
    )
  if paired:
    lines += [
      "",
      f"| arm - {paired[0]['baseline']} | pairs | mean | 95% over pairs | 95% over seeds | "
      "wins / ties / losses |",
      "|---|---|---|---|---|---|",
    ]
    for r in paired:
      lines.append(
        f"| {r['arm']} | {r['pairs']} ({r['seeds']} seeds) | {r['mean']:+.1f} | "
        f"[{_num(r['pairs_low'])}, {_num(r['pairs_high'])}] | "
        f"[{_num(r['seeds_low'])}, {_num(r['seeds_high'])}] | "
        f"{r['wins']} / {r['ties']} / {r['losses']} |"
      )
  return "\n".join(lines) + "\n"


__all__ = [
  "CONFIDENCE",
  "t_interval",
  "arm_summary",
  "paired_differences",
  "tip_usage",
  "report_markdown",
]
