"""Arms against a baseline over seeds (the exploration experiment's report, docs/results.md).

  python launch/compare.py --runs=runs/explore/eval/find-non-living-thing/it8 --baseline=grpo \
      --workdirs=runs/explore/arms/find-non-living-thing --out=runs/explore/report/it8

--runs: directories holding one launch/eval.py result per arm and seed (`method` = the arm's
--label, `seed`, one episode per test variation). Prints and writes compare.md / compare.json:
per arm the mean ± s.e. over seeds, and per arm the paired difference against --baseline by
(seed, variation) with 95% intervals over pairs and over seeds (empo2_jax/train/compare.py says
which to trust). --workdirs (training runs that saved their episodes, or a root holding them)
adds each run's tip usage: how often memory rollouts showed tips, and samples of what they said.
"""

from __future__ import annotations

import argparse
import json

from etils import epath

from empo2_jax import cli
from empo2_jax.baselines.results import read_results
from empo2_jax.train import compare


def tip_lines(workdirs: list[str]) -> tuple[list[str], dict]:
  from empo2_jax.data import episodes_html
  from empo2_jax.train.metrics import run_dirs

  lines, out = [], {}
  for run in run_dirs(workdirs):
    try:
      usage = compare.tip_usage(episodes_html.read_records(run))
    except cli.UserError:
      continue  # no saved episodes
    if not usage["memory_episodes"] and not usage["tips_written"]:
      continue  # a run without memory (GRPO)
    out[run.name] = usage
    lines.append(
      f"- {run.name}: {usage['memory_episodes']} of {usage['episodes']} episodes with memory; "
      f"{usage['steps_with_tips']} of their {usage['memory_steps']} steps showed a tip; "
      f"{usage['tips_written']} tips written"
    )
    for kind in ("written", "shown"):
      for t in usage[kind]:
        lines.append(f"  - {kind}: {json.dumps(t)}")
  return lines, out


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--runs", required=True, help="comma-separated evaluation directories")
  ap.add_argument(
    "--baseline", default="grpo", help="the arm the others are paired against ('': no pairing)"
  )
  ap.add_argument("--arms", default="", help="comma-separated arms to keep (default: all)")
  ap.add_argument("--workdirs", default="", help="comma-separated training runs or their roots")
  ap.add_argument("--out", default="", help="directory for compare.md and compare.json")
  args = ap.parse_args(argv)
  try:
    records = read_results([p for p in args.runs.split(",") if p])
  except FileNotFoundError as e:
    cli.fail(e)
  keep = {a for a in args.arms.split(",") if a}
  records = [r for r in records if not keep or r["method"] in keep]
  records.sort(key=lambda r: r["method"] != args.baseline)  # the baseline's row first
  try:
    summary = compare.arm_summary(records)
    paired = compare.paired_differences(records, args.baseline) if args.baseline else []
  except ValueError as e:
    cli.fail(e)
  text = compare.report_markdown(summary, paired)
  tips, usage = tip_lines([w for w in args.workdirs.split(",") if w])
  if tips:
    text += "\nTip usage (training runs):\n\n" + "\n".join(tips) + "\n"
  print(text, end="")
  if args.out:
    out = epath.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(text)
    blob = {"summary": summary, "paired": paired, "tips": usage}
    (out / "compare.json").write_text(json.dumps(blob, indent=1) + "\n")


if __name__ == "__main__":
  cli.guard(main)  # one-line errors for config and path mistakes (exit 2)
