"""What the actor reads memory with: the `Memory` record (encoder, store, index) with its
retrieval, and the two memory-key texts (agent/actor.py's docstring: memory_key_text).

  chat_key(messages, encoder, key_chars)          "chat": the chat as the encoder sees it
  recent_key(head, lines, encoder, key_chars)     "recent": the task line + the newest lines
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from empo2_jax.memory.index import MemoryIndex
from empo2_jax.tips import strip_tips_messages


class Memory:
  """The encoder, store and index used together by the actor."""

  def __init__(self, encoder, store, index):
    self.encoder, self.store, self.index = encoder, store, index

  def replace_store(self, store) -> None:
    """Use `store` from now on (a restored checkpoint's, another run's, an empty one); the index
    is rebuilt over it with the same retrieval settings (its caches belong to the old store)."""
    self.store = store
    self.index = MemoryIndex(store, self.index.cfg)

  def retrieve(
    self, slots: Sequence, keys: Sequence[str], fallback: bool = False
  ) -> list[list[str]]:
    """Tips for each (slot, key): the slot's hits (docs/fidelity.md, "memory per variation").

    A slot that holds no memory yet retrieves nothing (n = 0, so r_int = 1), as the authors'
    per-variation memory does; training rollouts always call it so. `fallback=True` (evaluation
    with memory on unseen variations, launch/adapt.py; `memory.unseen_fallback`) instead searches
    every slot of the slot's task and merges the hits by stored score.
    """
    if not keys:
      return []
    emb = self.encoder.encode(list(keys))
    own = [self.store.slot(s) is not None for s in slots]
    out = [[] for _ in keys]
    idx = [i for i, ok in enumerate(own) if ok]
    if idx:
      hits = self.index.search_batch([slots[i] for i in idx], emb[idx])
      for i, h in zip(idx, hits):
        out[i] = [x.text for x in h]
    for i, ok in enumerate(own):
      if not ok and fallback:
        out[i] = self._task_hits(slots[i][0], emb[i : i + 1])
    return out

  def _task_hits(self, task, emb_1d) -> list[str]:
    """Every slot of `task` searched with one key [1, d], hits merged by stored score."""
    task_slots = [k for k in self.store.keys() if k[0] == task]
    if not task_slots:
      return []
    hits = self.index.search_batch(task_slots, np.repeat(emb_1d, len(task_slots), 0))
    merged = [x for h in hits for x in h]
    merged.sort(key=lambda x: -x.score)
    return [x.text for x in merged[: self.index.cfg.top_k]]


def chat_key(messages, encoder=None, key_chars: int = 1200) -> str:
  """ "role: content" lines of the tip-free chat (system excluded, tip blocks removed: the
  authors key by the chat without its tips), cut to the encoder's first window (without an
  encoder: the first `key_chars` characters)."""
  text = "\n".join(
    f"{m['role']}: {m['content']}" for m in strip_tips_messages(messages) if m["role"] != "system"
  )
  if encoder is None:
    return text[:key_chars]
  pieces = encoder.tokenizer.encode(text)  # truncating tokenizer: the first window only
  if not pieces.overflowing:
    return text
  ends = [
    end for (_, end), special in zip(pieces.offsets, pieces.special_tokens_mask) if not special
  ]
  return text[: max(ends, default=0)]


def recent_key(head: str, lines: Sequence[str], encoder=None, key_chars: int = 1200) -> str:
  """`head` (the task line) + the most recent `lines` that fit the encoder's window.

  Lines are dropped from the front, counted in the encoder's word pieces, so the newest line (the
  current observation, the most step-specific part) is never what gets truncated. Without an
  encoder: the last `key_chars` characters.
  """
  lines = list(lines)
  if encoder is None:
    return "\n".join([head] + lines)[-key_chars:]
  counts = [len(e.ids) - 2 for e in encoder.tokenizer.encode_batch([head] + lines)]
  budget = encoder.cfg.max_seq_length - 2 - counts[0]
  kept = []
  for line, n in zip(reversed(lines), reversed(counts[1:])):
    if n > budget and kept:
      break
    kept.append(line)
    budget -= n
  return "\n".join([head] + kept[::-1])


__all__ = ["Memory", "chat_key", "recent_key"]
