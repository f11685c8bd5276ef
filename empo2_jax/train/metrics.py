"""Metrics at the edge: one JSON line per iteration in `metrics.jsonl`, TensorBoard event files,
and a live progress bar. Only scalars (ints, floats, bools) go to TensorBoard; strings (the mode)
go to the JSONL file only.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Optional

import numpy as np


def _scalar(v: Any):
  if isinstance(v, (bool, np.bool_)):
    return int(v)
  if isinstance(v, (int, np.integer)):
    return int(v)
  if isinstance(v, (float, np.floating)) or (hasattr(v, "shape") and getattr(v, "shape") == ()):
    return float(v)
  return None


class MetricsWriter:
  def __init__(
    self,
    workdir: str,
    total: Optional[int] = None,
    start: int = 0,
    progress: bool = True,
    tensorboard: bool = True,
  ):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._f = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(os.path.join(workdir, "tb"))
    self._bar = None
    if progress:
      from tqdm import tqdm

      self._bar = tqdm(total=total, initial=start, desc="empo2", dynamic_ncols=True)

  def write(self, step: int, metrics: dict) -> None:
    record = {"iteration": int(step), "time": time.time()}
    for k, v in metrics.items():
      s = _scalar(v)
      record[k] = s if s is not None else (v if isinstance(v, str) else str(v))
    self._f.write(json.dumps(record, allow_nan=True) + "\n")
    self._f.flush()
    if self._tb is not None:
      for k, v in record.items():
        if k not in ("iteration", "time") and isinstance(v, (int, float)) and math.isfinite(v):
          self._tb.add_scalar(k, v, step)
      self._tb.flush()
    if self._bar is not None:
      show = {
        k: record[k]
        for k in (
          "mode",
          "return_mean",
          "success",
          "loss/pg_loss",
          "memory_size",
          "eval/return_mean",
        )
        if k in record
      }
      self._bar.set_postfix(
        {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in show.items()}
      )
      self._bar.update(1)

  def close(self) -> None:
    self._f.close()
    if self._tb is not None:
      self._tb.close()
    if self._bar is not None:
      self._bar.close()


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
