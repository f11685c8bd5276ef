"""empo2_jax.memory: the tip memory of EMPO2 (docs/method.md §2-3).

store.MemoryStore (slots, FIFO, dedup, files) -> index.MemoryIndex (cosine > threshold, best score
first; ScaNN for large slots) -> reflect.reflect / reflect.commit (tips from the policy)
-> rewards.intrinsic_reward;
sync.gather_and_commit keeps every host's memory identical.
"""

from empo2_jax.memory.index import Hit, MemoryIndex, RetrievalConfig
from empo2_jax.memory.reflect import (
  MemoryWrite,
  ReflectEpisode,
  key_text,
)  # reflect.reflect / reflect.commit
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.memory.store import MemoryStore, SlotKey
from empo2_jax.memory.sync import EntryBatch, gather_and_commit

__all__ = [
  "Hit",
  "MemoryIndex",
  "RetrievalConfig",
  "MemoryWrite",
  "ReflectEpisode",
  "key_text",
  "intrinsic_reward",
  "MemoryStore",
  "SlotKey",
  "EntryBatch",
  "gather_and_commit",
]
