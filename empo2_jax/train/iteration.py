"""What one training iteration is made of, beside the Trainer (train/trainer.py): the mode draw
(docs/method.md §1), the rollout's episode specs and memory flags, the turns the update trains
on, the rollout's timing and the iteration's result.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

UPDATE_FLOOR_KEYS = ("len", "turns", "slots", "slot_rows")


def draw_mode(u: float, p_memory: float, q_offpolicy: float) -> str:
  """docs/method.md §1: u ~ U[0,1). off-policy if u < p*q; on-policy with tips if u < p; else
  on-policy."""
  if not (0.0 <= p_memory <= 1.0 and 0.0 <= q_offpolicy <= 1.0):
    raise ValueError(f"p_memory={p_memory} and q_offpolicy={q_offpolicy} must be in [0, 1]")
  if u < p_memory * q_offpolicy:
    return "off"
  if u < p_memory:
    return "on_tips"
  return "on"


@dataclasses.dataclass
class IterationResult:
  """What one iteration made (Trainer.train_iteration).

  Attributes:
    metrics: the iteration's metrics (rollout, batch, update, timing, views; metrics.jsonl).
    episodes: the policy's own episodes of the rollout (saved with train.save_episodes).
    batch: the host batch the update saw (arrays keyed by rl/batch.py's names), after mini-batch
      arrangement.
    per_sample: the update's per-sample figures (mask and length-check counts a sample;
      train/view_metrics.py), None when nothing was updated.
  """

  metrics: dict
  episodes: list
  batch: dict
  per_sample: Optional[dict] = None


def trainable_turns(episodes) -> list:
  """The turns the update trains on: every turn of every episode whose env worker did not fail
  (a failed one has a partial score)."""
  return [t for e in episodes if not e.env_failed for t in e.turns]


def rollout_timing(stats: dict, seconds: float) -> dict:
  """The rollout's wall-clock phases (agent/actor.py: time/rollout_*) and what is left of its
  `seconds` (time/rollout_other)."""
  phases = {k: v for k, v in stats.items() if k.startswith("time/rollout_")}
  return {**phases, "time/rollout_other": max(0.0, seconds - sum(phases.values()))}


def group_specs(task: str, variations: Sequence[int], group_size: int) -> list:
  """(task, variation, group_id) per episode: group_size episodes of each variation, one GRPO
  group a variation."""
  return [(task, v, g) for g, v in enumerate(variations) for _ in range(group_size)]


def memory_flags(view: str, n: int, group_size: int) -> tuple[list, list]:
  """(use_memory, shadow_memory) per episode of `n` (group_specs order) for a method's memory
  view (methods/base.Plugin.memory_view): "shown", "shadow" (retrieved, not shown), "split" (a
  group's first half shown, the rest shadow) or "none"."""
  if view == "split":
    shown = [i % group_size < group_size // 2 for i in range(n)]
  else:
    shown = [view == "shown"] * n
  return shown, [view in ("shadow", "split") and not s for s in shown]


__all__ = [
  "IterationResult",
  "UPDATE_FLOOR_KEYS",
  "draw_mode",
  "group_specs",
  "memory_flags",
  "rollout_timing",
  "trainable_turns",
]
