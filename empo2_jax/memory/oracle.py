"""Oracle memories (config `memory.oracle`): one tip a training variation, written from the
environment's gold path instead of from the agent's episodes, so a run's tips are known to be
right (docs/vault_bench.md, "ScienceWorld with oracle tips").

    store = oracle_store(encoder, env, task, variations, max_per_slot)
    oracle_tip(["open door to kitchen", "go to kitchen"])
    # "The actions that complete this task, in order: open door to kitchen; go to kitchen."
    oracle_actions(tip)  # the path back, e.g. from an episode record's tips

Each variation's slot holds exactly its own tip. A run with an oracle memory retrieves with no
similarity threshold (ORACLE_THRESHOLD, train/build.memory), so every step of a training
variation is shown its tip whatever the step's key; the memory stays as built (`memory.frozen`).
Every host builds the same store from the same gold paths: nothing is gathered.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from empo2_jax.memory.store import MemoryStore
from empo2_jax.memory.sync import EntryBatch

ORACLE_THRESHOLD = -2.0  # below every cosine: retrieval keeps each slot's one entry
_LEAD = "The actions that complete this task, in order: "


def oracle_tip(actions: Sequence[str]) -> str:
  """The tip of a gold path: its actions in order, separated by "; "."""
  actions = [" ".join(str(a).split()) for a in actions]
  if not actions or not all(actions):
    raise ValueError(f"a gold path needs at least one non-empty action, got {actions!r}")
  return _LEAD + "; ".join(actions) + "."


def oracle_actions(tip: str) -> list[str]:
  """The gold path an oracle_tip was written from (its inverse)."""
  if not tip.startswith(_LEAD) or not tip.endswith("."):
    raise ValueError(f"not an oracle tip: {tip[:80]!r}")
  return tip[len(_LEAD) : -1].split("; ")


def oracle_store(
  encoder, env, task: str, variations: Sequence[int], max_per_slot: int = 1000
) -> MemoryStore:
  """A memory with one entry per variation v of `task`: oracle_tip(env.gold_actions(task, v))
  in slot (task, v), score 1. The entry's key text is the task and variation (retrieval with
  ORACLE_THRESHOLD does not read it)."""
  variations = [int(v) for v in variations]
  if len(set(variations)) != len(variations):
    raise ValueError(f"oracle memory: variations repeat: {variations}")
  tips = [oracle_tip(env.gold_actions(task, v)) for v in variations]
  store = MemoryStore(dim=encoder.dim, max_per_slot=max_per_slot)
  n = len(variations)
  keys = [f"{task} variation {v}" for v in variations]
  emb = encoder.encode(keys) if n else np.zeros((0, store.dim), np.float32)
  batch = EntryBatch([(task, v) for v in variations], tips, np.ones(n), emb, np.zeros(n, np.int64))
  batch.add_to(store)
  if len(store) != n:
    raise RuntimeError(f"oracle memory holds {len(store)} entries for {n} variations")
  return store


__all__ = ["ORACLE_THRESHOLD", "oracle_actions", "oracle_store", "oracle_tip"]
