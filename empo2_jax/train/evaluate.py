"""Evaluation tables in the shape of the paper's Table 1: per task, return mean ± std and success.

`summarize(episodes)` reduces finished actor episodes; `table_markdown` / `table_csv` render rows
{task, setting, episodes, return_mean, return_std, success} for the README, papers and sweeps.
"""

from __future__ import annotations

import csv
import io
from typing import Sequence

import numpy as np

from empo2_jax.train.metrics import return_summary

COLUMNS = ("task", "setting", "episodes", "return_mean", "return_std", "success")


def summarize(task: str, setting: str, returns: Sequence[float], successes: Sequence[bool]) -> dict:
  r = np.asarray(returns, np.float64)
  if r.size == 0:
    raise ValueError(f"no episodes to summarise for {task} ({setting})")
  return {"task": task, "setting": setting, "episodes": int(r.size), **return_summary(r, successes)}


def with_average(rows: Sequence[dict]) -> list[dict]:
  """Rows plus one 'average' row per setting (mean of the per-task means, as the paper reports)."""
  out = list(rows)
  for setting in dict.fromkeys(r["setting"] for r in rows):
    sub = [r for r in rows if r["setting"] == setting]
    if len(sub) > 1:
      out.append(
        {
          "task": "average",
          "setting": setting,
          "episodes": int(sum(r["episodes"] for r in sub)),
          "return_mean": float(np.mean([r["return_mean"] for r in sub])),
          "return_std": float(np.std([r["return_mean"] for r in sub])),
          "success": float(np.mean([r["success"] for r in sub])),
        }
      )
  return out


def table_markdown(rows: Sequence[dict]) -> str:
  lines = ["| task | setting | episodes | return | success |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(
      f"| {r['task']} | {r['setting']} | {r['episodes']} | "
      f"{r['return_mean']:.1f} ± {r['return_std']:.1f} | {100 * r['success']:.1f}% |"
    )
  return "\n".join(lines) + "\n"


def table_csv(rows: Sequence[dict]) -> str:
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=COLUMNS)
  w.writeheader()
  for r in rows:
    w.writerow({k: r[k] for k in COLUMNS})
  return buf.getvalue()
