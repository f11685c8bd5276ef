"""The vault bench's table, decisions and plot from its records (docs/vault_bench.md).

    rows = summarize(read_records(records_dir))   # per arm: figures, paired differences vs D
    text = report(records_dir, plot="vault_bench.png")

Per arm-seed the primary figures are tip-free, on the trained vaults, at the last iteration:
`greedy` (the share of vaults whose greedy answer is the code) and `p_code` (the mean exact
probability of the code); `unseen_greedy` / `unseen_p_code` the same on unseen vaults (chance:
1/64). Per arm: the mean over seeds, and, for every arm but D, the difference to D paired by seed
with its 95% t-interval (n - 1 degrees of freedom). The decision rules (`decide`) are the
protocol's, fixed before any arm ran.
"""

from __future__ import annotations

import glob
import json
import math
import os
from typing import Optional

import numpy as np

FIGURES = (
  "greedy", "p_code", "unseen_greedy", "unseen_p_code", "with_tips_p_code", "greedy_own_code",
)  # fmt: skip
DISTILS_PP, NOT_DISTILS_PP, P_MIN = 0.25, 0.10, 0.50


def read_records(records_dir: str) -> list[dict]:
  return [
    json.load(open(p)) for p in sorted(glob.glob(os.path.join(records_dir, "arms", "*.json")))
  ]


def figures(rec: dict) -> dict:
  """An arm-seed record's figures (module docstring) and its machinery measures."""
  s = rec["scores"]

  def mean(part, key):
    vals = [float(v[key]) if key == "greedy" else math.exp(v["logp"]) for v in s[part].values()]
    return float(np.mean(vals))

  mets = rec["metrics"]

  def series(key):
    return [m[key] for m in mets if key in m]

  shared = _shared_code_vaults(list(s["trained"]))
  own = [v for v in s["trained"] if v not in shared]
  out = {
    "greedy_own_code": float(np.mean([float(s["trained"][v]["greedy"]) for v in own]))
    if own
    else float("nan"),
    "greedy": mean("trained", "greedy"),
    "p_code": mean("trained", "logp"),
    "unseen_greedy": mean("unseen", "greedy"),
    "unseen_p_code": mean("unseen", "logp"),
    "with_tips_p_code": mean("trained_with_tips", "logp"),
    "train_success_last": series("success")[-1] if series("success") else float("nan"),
    "groups_mixed_mean": float(np.mean(series("groups_mixed"))) if series("groups_mixed") else 0.0,
    "adv_abs_mean": float(np.mean(series("advantage_abs_mean"))) if mets else 0.0,
  }
  kl = series("loss/ctx_kl_k1")
  if kl:
    out["ctx_kl_first"], out["ctx_kl_last"] = float(kl[0]), float(kl[-1])
  added = series("loss/opid/abs_added")
  if added:
    out["opid_abs_added"] = float(np.mean(added))
    out["opid_abs_adv"] = float(np.mean(series("loss/opid/abs_adv")))
  for q in ("p5", "p50", "p95"):
    r = series(f"loss/ratio_{q}")
    if r:
      out[f"ratio_{q}"] = float(np.median(r))
  return out


def _shared_code_vaults(vaults) -> set:
  """The trained vaults whose code another trained vault also has (default buttons and length):
  a policy that answers a code common in the memory scores on all of them (a post-hoc measure:
  `greedy_own_code` leaves them out)."""
  from empo2_jax.envs.vault import vault_code

  codes = {v: tuple(vault_code(int(v))) for v in vaults}
  return {v for v in vaults if sum(c == codes[v] for c in codes.values()) > 1}


def t_interval(x) -> tuple[float, float, float]:
  """(mean, low, high): the 95% t-interval of the mean of x (n - 1 degrees of freedom); the
  bounds are nan for fewer than 2 values."""
  from scipy import stats

  x = np.asarray(x, np.float64)
  m = float(x.mean()) if len(x) else float("nan")
  if len(x) < 2:
    return m, float("nan"), float("nan")
  half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
  return m, m - half, m + half


def summarize(records: list[dict]) -> dict:
  """{arm: {"seeds", "figures": {name: mean}, "minus_d": {name: (mean, low, high, per-seed)}}}."""
  by_arm: dict = {}
  for rec in records:
    by_arm.setdefault(rec["arm"], {})[rec["seed"]] = figures(rec)
  d = by_arm.get("D", {})
  out = {}
  for arm, seeds in by_arm.items():
    figs = {k: float(np.mean([f[k] for f in seeds.values() if k in f])) for k in _keys(seeds)}
    row = {"seeds": sorted(seeds), "figures": figs, "minus_d": {}}
    paired = sorted(set(seeds) & set(d)) if arm != "D" else []
    for k in FIGURES:
      diffs = [seeds[s][k] - d[s][k] for s in paired]
      if diffs:
        row["minus_d"][k] = (*t_interval(diffs), diffs)
    out[arm] = row
  return out


def _keys(seeds: dict) -> list:
  return sorted({k for f in seeds.values() for k in f})


def decide(arm: str, rows: dict, gate_holds: bool) -> str:
  """The protocol's verdict for `arm` (docs/vault_bench.md, "Decision rules")."""
  row = rows.get(arm)
  if arm in ("D", "P", "W") or row is None or "greedy" not in row["minus_d"]:
    return ""
  mean, low, high, diffs = row["minus_d"]["greedy"]
  w = rows.get("W", {}).get("minus_d", {}).get("greedy")
  w_ok = w is not None and abs(w[0]) < 0.10  # without the negative control no arm distils
  unseen = row["figures"].get("unseen_greedy", 0.0)
  at_chance = unseen <= 0.10
  if mean >= DISTILS_PP and low > 0 and all(x > 0 for x in diffs) and w_ok and at_chance:
    return "distils"
  p = rows.get("P", {}).get("figures", {}).get("greedy", 0.0)
  if gate_holds and p >= P_MIN and high < NOT_DISTILS_PP and _active(arm, row):
    return "does not distil"
  return "undecided"


def _active(arm: str, row: dict) -> bool:
  """Whether the objective's machinery measurably ran (the protocol's condition)."""
  f = row["figures"]
  if arm in ("A", "B", "E"):
    return f.get("adv_abs_mean", 0.0) > 0
  if arm in ("F", "F+"):
    return f.get("ctx_kl_last", 0.0) < f.get("ctx_kl_first", 0.0)
  if arm == "G":
    return f.get("opid_abs_added", 0.0) > 0
  return False


def _fmt_interval(t) -> str:
  mean, low, high, _ = t
  if math.isnan(low):
    return f"{mean:+.3f}"
  return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


ORDER = ("D", "P", "A", "B", "E", "F", "F+", "G", "W")


def table(rows: dict, gate_holds: bool) -> str:
  """The markdown table of docs/results.md."""
  head = (
    "| arm | seeds | trained greedy | - D (95% CI) | trained p(code) | - D (95% CI) | "
    "unseen greedy | with-tip p(code) | verdict |\n|---|---|---|---|---|---|---|---|---|"
  )
  lines = [head]
  for arm in [a for a in ORDER if a in rows] + sorted(set(rows) - set(ORDER)):
    r = rows[arm]
    f, md = r["figures"], r["minus_d"]
    lines.append(
      f"| {arm} | {len(r['seeds'])} | {f['greedy']:.3f} | "
      f"{_fmt_interval(md['greedy']) if 'greedy' in md else '-'} | {f['p_code']:.3f} | "
      f"{_fmt_interval(md['p_code']) if 'p_code' in md else '-'} | {f['unseen_greedy']:.3f} | "
      f"{f['with_tips_p_code']:.3f} | {decide(arm, rows, gate_holds)} |"
    )
  return "\n".join(lines)


def plot_success(rows: dict, path: str) -> None:
  """Per arm, trained vs unseen tip-free greedy success, mean over seeds with 95% t-intervals
  (cut to [0, 1])."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = [a for a in ORDER if a in rows]
  fig, ax = plt.subplots(figsize=(7, 3.2))
  for j, (key, label) in enumerate((("greedy", "trained vaults"), ("unseen_greedy", "unseen"))):
    means, errs = [], [[], []]
    for a in arms:
      m, lo, hi = t_interval(rows[a]["per_seed"][key]) if "per_seed" in rows[a] else (0, 0, 0)
      means.append(m)
      lo, hi = (m, m) if math.isnan(lo) else (max(lo, 0.0), min(hi, 1.0))  # a share: [0, 1]
      errs[0].append(m - lo)
      errs[1].append(hi - m)
    xs = np.arange(len(arms)) + (j - 0.5) * 0.38
    ax.bar(xs, means, 0.38, yerr=errs, capsize=3, label=label)
  ax.axhline(1 / 64, color="gray", lw=0.8, ls="--", label="chance (1/64)")
  ax.set_xticks(np.arange(len(arms)), arms)
  ax.set_ylabel("tip-free greedy success")
  ax.set_ylim(0, 1.05)
  ax.legend(fontsize=8, loc="upper right")
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def report(records_dir: str, plot: Optional[str] = None) -> str:
  """The gate line, the table, the machinery figures; writes the plot when a path is given."""
  recs = read_records(records_dir)
  short = [r for r in recs if len(r["metrics"]) < r["iterations"]]
  recs = [r for r in recs if len(r["metrics"]) >= r["iterations"]]
  if not recs:
    raise FileNotFoundError(f"no complete arm records under {records_dir}/arms: run the bench")
  gate_path = os.path.join(records_dir, "gate.json")
  gate = json.load(open(gate_path)) if os.path.exists(gate_path) else {}
  rows = summarize(recs)
  for rec in recs:
    rows[rec["arm"]].setdefault("per_seed", {k: [] for k in FIGURES})
    for k, v in figures(rec).items():
      if k in FIGURES:
        rows[rec["arm"]]["per_seed"][k].append(v)
  out = []
  if gate:
    out.append(
      f"gate: with-tip success {gate['with_tips']['success']:.3f}, tip-free "
      f"{gate['tip_free']['success']:.3f}, mixed groups {gate['with_tips']['groups_mixed']:.3f} "
      f"({gate['episodes_each']} episodes each); holds: {gate['holds']}"
    )
  if short:
    out.append(
      "left out, stopped before their last iteration (delete and rerun them): "
      + ", ".join(
        f"{r['arm']}_s{r['seed']} ({len(r['metrics'])} of {r['iterations']})" for r in short
      )
    )
  out.append(table(rows, bool(gate.get("holds"))))
  if any(_shared_code_vaults(list(r["scores"]["trained"])) for r in recs):
    out.append("")
    out.append("| arm | greedy, vaults with a code of their own (post hoc) | - D (95% CI) |")
    out.append("|---|---|---|")
    for arm in [a for a in ORDER if a in rows]:
      md = rows[arm]["minus_d"].get("greedy_own_code")
      own = rows[arm]["figures"].get("greedy_own_code", float("nan"))
      out.append(f"| {arm} | {own:.3f} | {_fmt_interval(md) if md else '-'} |")
  out.append("")
  out.append("| arm | train success (last it.) | mixed groups | abs adv | ratio p5/p50/p95 | "
             "teacher KL first -> last | OPID abs added / abs adv |")  # fmt: skip
  out.append("|---|---|---|---|---|---|---|")
  for arm in [a for a in ORDER if a in rows]:
    f = rows[arm]["figures"]
    ratio = "/".join(f"{f[k]:.2f}" for k in ("ratio_p5", "ratio_p50", "ratio_p95") if k in f)
    kl = f"{f['ctx_kl_first']:.3f} -> {f['ctx_kl_last']:.3f}" if "ctx_kl_first" in f else "-"
    op = f"{f['opid_abs_added']:.3f} / {f['opid_abs_adv']:.3f}" if "opid_abs_added" in f else "-"
    out.append(
      f"| {arm} | {f['train_success_last']:.3f} | {f['groups_mixed_mean']:.3f} | "
      f"{f['adv_abs_mean']:.3f} | {ratio or '-'} | {kl} | {op} |"
    )
  if plot:
    plot_success(rows, plot)
  return "\n".join(out)


__all__ = [
  "FIGURES",
  "read_records",
  "figures",
  "t_interval",
  "summarize",
  "decide",
  "table",
  "plot_success",
  "report",
]
