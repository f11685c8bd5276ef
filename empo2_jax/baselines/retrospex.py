"""Retrospex's dynamic action re-scoring (docs/methods.md §3.2 item 5): the LLM proposes candidate
actions, an offline critic (baselines/retrospex_iql.py) re-scores them.

    cands = candidates(texts, logps, k)              # K samples -> distinct, top-k by log-prob
    i, scores = rescore(p, q, t, b, d)               # the action to take at step t

  p_i = exp(mean token log-prob of candidate i given the chat)      (Retrospex's cal_prob)
  q_i = Q_target(task, obs, a_i) - V(task, obs)                     (its get_q: an advantage)
  p^, q^ = min-max normalised over the candidates (all 0.5 where max == min)
  lambda_t = max(b, d^t);   a_t = argmax_i lambda_t * p^_i + (1 - lambda_t) * q^_i
Early steps follow the LLM (lambda near 1), later ones lean on the critic down to weight 1 - b.
Retrospex's ScienceWorld defaults: d = 0.97, b = 0.6 (run_eval.sh), t counted from 1; WebShop:
d = 0.9, b = 0.5, t from 0.

Candidates here are the policy's own samples: K responses per step at temperature 1 (so the
sampler's log-probs are the model's), grouped by their normalised text, each keeping its best
log-prob, top-k by that. Retrospex maps its samples to the environment's valid actions first
(SBERT similarity); ours go to the environment as they are and it corrects them (Jaccard, as in
every other method of this project), so the critic scores the text the policy wrote.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RescoreConfig:
  samples: int = 4  # K responses sampled per step (Retrospex: 4 on WebShop/ALFWorld)
  top_k: int = 4  # candidates kept, by log-prob
  discount: float = 0.97  # d
  floor: float = 0.6  # b
  t0: int = 1  # the first step's t (ScienceWorld/ALFWorld 1, WebShop 0)
  temperature: float = 1.0

  def __post_init__(self):
    if self.samples < 1 or self.top_k < 1:
      raise ValueError(f"samples={self.samples} and top_k={self.top_k} must be >= 1")
    if not (0.0 <= self.floor <= 1.0 and 0.0 <= self.discount <= 1.0):
      raise ValueError(f"discount={self.discount} and floor={self.floor} must be in [0, 1]")


def minmax(x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  lo, hi = x.min(), x.max()
  if hi == lo:
    return np.full_like(x, 0.5)
  return (x - lo) / (hi - lo)


def critic_weight(t: int, discount: float, floor: float) -> float:
  """lambda_t = max(b, d^t): the LLM's weight at step t."""
  return max(floor, discount**t)


def rescore(p, q, t: int, discount: float, floor: float) -> tuple[int, np.ndarray]:
  """(index of the chosen candidate, combined scores) for LLM likelihoods p and critic
  advantages q of the same candidates."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  if p.shape != q.shape or p.ndim != 1 or p.size == 0:
    raise ValueError(f"p {p.shape} and q {q.shape} must be the same non-empty 1-D shape")
  lam = critic_weight(t, discount, floor)
  scores = lam * minmax(p) + (1.0 - lam) * minmax(q)
  return int(np.argmax(scores)), scores


def normalise_action(text: str) -> str:
  return " ".join(str(text).lower().split())


def candidates(texts: Sequence[str], mean_logps: Sequence[float], top_k: int):
  """Distinct (by normalised text) sampled actions, each with its best mean token log-prob,
  the top_k by that: [(text, mean_logp)], best first. Empty texts are dropped (all empty: [])."""
  best: dict[str, tuple[str, float]] = {}
  for text, lp in zip(texts, mean_logps):
    key = normalise_action(text)
    if not key:
      continue
    if key not in best or lp > best[key][1]:
      best[key] = (text, float(lp))
  ranked = sorted(best.values(), key=lambda x: -x[1])
  return ranked[:top_k]


__all__ = ["RescoreConfig", "minmax", "critic_weight", "rescore", "candidates", "normalise_action"]
