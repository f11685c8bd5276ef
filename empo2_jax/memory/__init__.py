"""empo2_jax.memory: the tip memory of EMPO2 (docs/method.md §2-3).

store.MemoryStore (slots, FIFO, dedup, files) -> index.MemoryIndex (cosine > threshold, best score
first; ScaNN for large slots); reflect (the tip chat, the tip's clean-up, the memory writes it
becomes; agent/actor.Actor.reflect samples the tips) -> sync.gather_and_commit (every host adds
every host's writes, so all memories stay identical); rewards.intrinsic_reward.
"""

from empo2_jax.memory.index import Hit, MemoryIndex, RetrievalConfig
from empo2_jax.memory.reflect import MemoryWrite, memory_writes, reflection_chat
from empo2_jax.tips import clean_tip
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.memory.store import MemoryStore, SlotKey
from empo2_jax.memory.sync import EntryBatch, gather_and_commit

__all__ = [
  "Hit",
  "MemoryIndex",
  "RetrievalConfig",
  "MemoryWrite",
  "clean_tip",
  "memory_writes",
  "reflection_chat",
  "intrinsic_reward",
  "MemoryStore",
  "SlotKey",
  "EntryBatch",
  "gather_and_commit",
]
