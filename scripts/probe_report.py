"""The distillation probe experiment's table (scripts/probe_experiment.sh report) and its
committed records (... archive). Reads ROOT/scores/<arm>_s<seed>.json and start.json
(launch/probe.py --out), ROOT/evals/<arm>_s<seed>/eval/result.json (launch/eval.py) and
ROOT/arms/<arm>_s<seed>/metrics.jsonl (the update's view/<mode>/ metrics); prints markdown.

  python scripts/probe_report.py ROOT [--arms="A D B C"] [--seeds="0 1 2"] [--scores=scores]
  python scripts/probe_report.py ROOT --archive=docs/probe   # the inputs above, small, copied

Per arm: the change from the start in the probe's mean tip-free log-prob per token (success set:
what tips achieved; failed set: the specificity control) and in its top-1 agreement, mean ± s.e.
over seeds; the paired difference of the success-set change against arm D (any update, no
distillation) and against arm A (the paper-era default), by seed, with a 95% t-interval over
seeds; tip-free success and return on the probe variations; the update's masked fractions; the
off-policy ratio's quantiles, the share of positive-advantage tokens with r < 1 - eps_low and the
teacher-student KL estimate (means over the run's iterations of loss/ratio_p5, ..., loss/ctx_kl_k1).
--scores picks the probe set's scores directory (scores: the unseen dev set; scores_insample: the
update variations' own set).
An arm-seed without its score is left out (n says how many seeds each figure has).
"""

import argparse
import glob
import json
import math
import os
import shutil

import numpy as np

from empo2_jax.train.compare import t_interval

SETS = ("success", "failed")


def _load(path):
  with open(path) as f:
    return json.load(f)


def _metrics(root, run):
  path = os.path.join(root, "arms", run, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def mask_figures(records) -> dict:
  """Summed over a run's iterations and views: samples, masked, positive-advantage samples and
  the masked among them, below-delta samples, dropped_long and context truncations."""
  tot = dict.fromkeys(
    ("samples", "masked", "pos_adv", "masked_pos_adv", "below_delta", "dropped_long"), 0
  )
  tot["context_truncations"] = 0
  for r in records:
    for k, v in r.items():
      if k.startswith("view/"):
        name = k.split("/", 2)[2]
        if name in tot:
          tot[name] += v
  return tot


def _pm(values, fmt=".3f"):
  a = np.asarray(values, np.float64)
  if a.size == 0:
    return "-"
  se = a.std(ddof=1) / math.sqrt(a.size) if a.size > 1 else math.nan
  return f"{a.mean():{fmt}} ± {se:{fmt}}" if a.size > 1 else f"{a.mean():{fmt}}"


def _interval(values, fmt=".3f"):
  if not values:
    return "-"
  m, lo, hi = t_interval(values)
  return f"{m:+{fmt}} [{lo:+{fmt}}, {hi:+{fmt}}]" if len(values) > 1 else f"{m:+{fmt}}"


def update_figures(records) -> dict:
  """Means over a run's iterations of the update's ratio and teacher figures (absent: nan)."""
  keys = ("ratio_p5", "ratio_p50", "ratio_p95", "pos_adv_low_ratio", "ctx_kl_k1")
  out = {}
  for k in keys:
    vals = [r[f"loss/{k}"] for r in records if f"loss/{k}" in r]
    out[k] = float(np.mean(vals)) if vals else math.nan
  return out


def report(root, arms, seeds, scores="scores") -> str:
  start = _load(os.path.join(root, scores, "start.json"))
  base = {s: start["sets"][s] for s in SETS}
  delta = {}  # (arm, seed) -> {set: d logp, "top1": d top1}
  for arm in arms:
    for seed in seeds:
      path = os.path.join(root, scores, f"{arm}_s{seed}.json")
      if os.path.exists(path):
        got = _load(path)["sets"]
        d = {s: got[s]["logp_mean"] - base[s]["logp_mean"] for s in SETS}
        d["top1"] = got["success"]["top1"] - base["success"]["top1"]
        delta[(arm, seed)] = d
  lines = [
    f"Start: success set {base['success']['samples']} samples, logp "
    f"{base['success']['logp_mean']:.4f}, top-1 {base['success']['top1']:.4f}; failed set "
    f"{base['failed']['samples']} samples, logp {base['failed']['logp_mean']:.4f}.",
    "",
    "| arm | n | d logp success | d logp failed | d top-1 success | - D (95% over seeds) "
    "| - A (95% over seeds) | tip-free success (probe vars) | masked / samples "
    "| masked pos-adv / pos-adv | dropped_long | ratio p5 / p50 / p95 | A>0, r<1-eps "
    "| teacher KL |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for arm in arms:
    got = [s for s in seeds if (arm, s) in delta]
    vs = {}
    for ref in ("D", "A"):
      pairs = [
        delta[(arm, s)]["success"] - delta[(ref, s)]["success"] for s in got if (ref, s) in delta
      ]
      vs[ref] = "-" if ref == arm else _interval(pairs)
    succ = []
    for s in got:
      path = os.path.join(root, "evals", f"{arm}_s{s}", "eval", "result.json")
      if os.path.exists(path):
        succ.append(float(np.mean(_load(path)["successes"])))
    mask = [mask_figures(_metrics(root, f"{arm}_s{s}")) for s in got]
    tot = {k: sum(m[k] for m in mask) for k in (mask[0] if mask else {})}
    upd = [update_figures(_metrics(root, f"{arm}_s{s}")) for s in got]
    fig = {k: float(np.mean([u[k] for u in upd])) if upd else math.nan for k in (
      "ratio_p5", "ratio_p50", "ratio_p95", "pos_adv_low_ratio", "ctx_kl_k1")}  # fmt: skip
    lines.append(
      f"| {arm} | {len(got)} | {_pm([delta[(arm, s)]['success'] for s in got])} "
      f"| {_pm([delta[(arm, s)]['failed'] for s in got])} "
      f"| {_pm([delta[(arm, s)]['top1'] for s in got])} | {vs['D']} | {vs['A']} "
      f"| {_pm(succ, '.2f')} "
      f"| {tot.get('masked', 0)} / {tot.get('samples', 0)} "
      f"| {tot.get('masked_pos_adv', 0)} / {tot.get('pos_adv', 0)} "
      f"| {tot.get('dropped_long', 0)} "
      f"| {fig['ratio_p5']:.3f} / {fig['ratio_p50']:.3f} / {fig['ratio_p95']:.3f} "
      f"| {fig['pos_adv_low_ratio']:.3f} | {fig['ctx_kl_k1']:.3f} |"
    )
  start_eval = os.path.join(root, "evals", "start", "eval", "result.json")
  if os.path.exists(start_eval):
    lines.append("")
    lines.append(
      f"Start, tip-free on the probe variations: success "
      f"{np.mean(_load(start_eval)['successes']):.2f}."
    )
  return "\n".join(lines)


def archive(root, dest) -> None:
  """Scores, eval results, run metrics and the probe set into `dest` (same layout)."""
  pats = ("scores/*.json", "scores_insample/*.json", "evals/*/eval/result.json",
          "arms/*/metrics.jsonl", "memory/metrics.jsonl", "probe/probe.jsonl",
          "probe/eval/result.json", "insample/probe.jsonl", "insample/eval/result.json",
          "sft/sft_summary.json")  # fmt: skip
  for pat in pats:
    for src in glob.glob(os.path.join(root, pat)):
      out = os.path.join(dest, os.path.relpath(src, root))
      os.makedirs(os.path.dirname(out), exist_ok=True)
      shutil.copyfile(src, out)
      print(f"archived {out}")


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("root")
  ap.add_argument("--arms", default="A D B C")
  ap.add_argument("--seeds", default="0 1 2")
  ap.add_argument("--archive", default="")
  ap.add_argument("--scores", default="scores", help="scores (dev set) or scores_insample")
  args = ap.parse_args()
  if args.archive:
    archive(args.root, args.archive)
    return
  seeds = [int(s) for s in args.seeds.split()]
  print(report(args.root, args.arms.split(), seeds, args.scores))


if __name__ == "__main__":
  main()
