"""Adaptation to an unseen task with memory only (the paper's Figure 8): a trained policy runs K
trials on a task it never trained on; after every trial it writes its tips into the memory
(EMPO2's reflection, agent/actor.Actor.reflect), and the next trial reads them. No weight is
updated.

    records = adapt(actor, params, model_config, task, variations, trials=10,
                    temperature=0.4, rng=key)
    [r["return_mean"] for r in records]          # return per trial

Each trial runs every variation once (group = variation) with memory on; trial 1 starts from the
memory the actor holds (launch/adapt.py gives it an empty one: the unseen task has no memories).
Per trial: return mean/std and success over the variations, memory size before and after, tips
retrieved per step.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import jax

from empo2_jax.train.metrics import episode_summary


def adapt(
  actor,
  params,
  model_config,
  task: str,
  variations: Sequence[int],
  trials: int,
  *,
  temperature: float,
  rng: jax.Array,
  memory_fallback: bool = True,
) -> list[dict]:
  if actor.memory is None:
    raise ValueError("adapt needs an Actor with a Memory (it writes and reads tips)")
  if trials < 1:
    raise ValueError(f"trials={trials} must be >= 1")
  specs = [(task, int(v), j) for j, v in enumerate(variations)]
  records = []
  for k in range(trials):
    before = len(actor.memory.store)
    rollout = actor.rollout(
      params,
      model_config,
      specs,
      use_memory=True,
      temperature=temperature,
      rng=jax.random.fold_in(rng, k),
      mode="on_tips",
      memory_fallback=memory_fallback,
    )
    with contextlib.closing(rollout):
      actor.reflect(rollout, iteration=k)
    stats = rollout.stats
    ok = [e for e in rollout.episodes if not e.env_failed]
    records.append(
      {
        "trial": k + 1,
        **episode_summary(rollout.episodes),
        "memory_before": before,
        "memory_after": len(actor.memory.store),
        "retrieved_per_step": (
          stats["retrieved"] / stats["memory_steps"] if stats.get("memory_steps") else 0.0
        ),
        "returns": [float(e.episode_return) for e in ok],
      }
    )
  return records


__all__ = ["adapt"]
