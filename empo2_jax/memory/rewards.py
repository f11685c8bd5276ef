"""Intrinsic reward of memory rollouts (docs/method.md §3): r_int = scale / (n + 1), n = memories
retrieved."""

from __future__ import annotations

import numpy as np


def intrinsic_reward(n_retrieved, scale: float = 1.0, used_memory=None) -> np.ndarray:
  """Per-step bonus, any shape: scale / (n + 1); 0 where `used_memory` (same shape, bool) is False.

  Steps of rollouts without memory get no bonus (the caller passes used_memory, or only memory
  steps).
  """
  n = np.asarray(n_retrieved)
  if np.any(n < 0):
    raise ValueError("number of retrieved memories must be >= 0")
  r = float(scale) / (n.astype(np.float32) + 1.0)
  if used_memory is not None:
    r = np.where(np.asarray(used_memory, bool), r, np.float32(0.0))
  return r.astype(np.float32)
