"""One evaluation's result as `<workdir>/eval/result.json`: what launch/table.py reads.

    write_result(workdir, method="grpo", task="find-animal", env="scienceworld",
                 returns=[...], successes=[...], extra={"iteration": 3})

Written by launch/eval.py (training runs' checkpoints, naive, reflexion) and launch/retrospex.py
eval. Fields: method, task, env, episodes, returns and successes (per episode), return_mean,
return_std, success (rate), plus `extra` (e.g. Reflexion's per-trial curves). Paths go through
etils.epath (local or gs://).
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
from etils import epath

from empo2_jax.train.metrics import return_summary

RESULT_FILE = "result.json"


def result_record(
  method: str,
  task: str,
  env: str,
  returns: Sequence[float],
  successes: Sequence[bool],
  extra: dict | None = None,
) -> dict:
  r = np.asarray(returns, np.float64)
  if r.size == 0:
    raise ValueError(f"no episodes to report for {method} on {task}")
  if len(successes) != r.size:
    raise ValueError(f"{len(successes)} success flags for {r.size} returns")
  rec = {
    "method": method,
    "task": task,
    "env": env,
    "episodes": int(r.size),
    "returns": [float(x) for x in r],
    "successes": [bool(s) for s in successes],
    **return_summary(r, successes),
  }
  rec.update(extra or {})
  return rec


def write_result(workdir, **kwargs) -> epath.Path:
  """<workdir>/eval/result.json from result_record(**kwargs); returns its path."""
  out = epath.Path(workdir) / "eval"
  out.mkdir(parents=True, exist_ok=True)
  path = out / RESULT_FILE
  path.write_text(json.dumps(result_record(**kwargs), indent=1) + "\n")
  return path


def read_results(paths: Sequence[str]) -> list[dict]:
  """Every eval/result.json at or below the given run directories (a sweep root stands for all
  its runs); each record gains "workdir"."""
  out = []
  for p in paths:
    root = epath.Path(str(p).rstrip("/"))
    found = []
    if root.is_dir():  # the run itself, or runs up to two levels below (sweep/method/task)
      for pattern in ("eval", "*/eval", "*/*/eval"):
        found += sorted(root.glob(f"{pattern}/{RESULT_FILE}"))
    if not found:
      raise FileNotFoundError(
        f"no eval/{RESULT_FILE} at or below {p}: evaluate the run first (launch/eval.py "
        "--workdir=RUN, launch/eval.py --method=naive|reflexion, launch/retrospex.py eval)"
      )
    for f in found:
      rec = json.loads(f.read_text())
      rec["workdir"] = str(f.parent.parent)
      out.append(rec)
  return out


__all__ = ["RESULT_FILE", "result_record", "write_result", "read_results"]
