"""Multi-host memory: gather the entries every host wrote so that all hosts hold the same memory.

Each host reflects on its own episodes and embeds their keys locally, then `gather_and_commit` ships
the new entries (serialised to one uint8 buffer) through `allgather_bytes`
(`jax.experimental.multihost_utils.process_allgather` on length-padded uint8 arrays) and every host
adds ALL hosts' entries to its own store in process order (0, 1, ...). Since the store is
deterministic (FIFO + dedup), identical inputs in an identical order keep the stores identical. With
one process every gather is the identity. Two processes are tested in
tests/memory/test_sync_multiprocess.py (jax.distributed on CPU).

`allgather_bytes` is the one host-level gather of the package: the actor ships its episodes with it
too (agent/hosts.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from empo2_jax.memory.store import MemoryStore


def allgather_bytes(payload: bytes) -> list[bytes]:
  """Every process's `payload`, in process order; a collective: every process must call it.

  Two gathers: the lengths, then the payloads zero-padded to the longest (process_allgather needs
  one shape on all hosts). With one process: [payload], no device work.
  """
  import jax

  if jax.process_count() == 1:
    return [bytes(payload)]
  from jax.experimental import multihost_utils

  buf = np.frombuffer(payload, np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([len(buf)], np.int64)))
  lengths = lengths.reshape(-1)
  padded = np.zeros(max(int(lengths.max()), 1), np.uint8)
  padded[: len(buf)] = buf
  bufs = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  return [bufs[p, : lengths[p]].tobytes() for p in range(len(lengths))]


@dataclasses.dataclass
class EntryBatch:
  """New memory entries: slot keys, texts, scores [n], embeddings [n, d] float32, iterations [n]."""

  slots: list[tuple[str, int]]
  texts: list[str]
  scores: np.ndarray
  embeddings: np.ndarray
  iterations: np.ndarray

  def __post_init__(self):
    self.slots = [(str(t), int(v)) for t, v in self.slots]
    self.scores = np.asarray(self.scores, np.float32).reshape(-1)
    self.iterations = np.asarray(self.iterations, np.int64).reshape(-1)
    self.embeddings = np.asarray(self.embeddings, np.float32)
    n = len(self.texts)
    if self.embeddings.ndim != 2 or len(self.embeddings) != n:
      raise ValueError(f"EntryBatch embeddings must be [n={n}, d], got {self.embeddings.shape}")
    if not (len(self.slots) == len(self.scores) == len(self.iterations) == n):
      raise ValueError("EntryBatch fields differ in length")

  def __len__(self) -> int:
    return len(self.texts)

  def to_bytes(self) -> np.ndarray:
    header = json.dumps(
      {"slots": self.slots, "texts": self.texts, "dim": int(self.embeddings.shape[1])}
    )
    h = header.encode("utf-8")
    parts = [
      np.array([len(h)], "<i8").tobytes(),
      h,
      self.embeddings.astype("<f4").tobytes(),
      self.scores.astype("<f4").tobytes(),
      self.iterations.astype("<i8").tobytes(),
    ]
    return np.frombuffer(b"".join(parts), np.uint8).copy()

  @classmethod
  def from_bytes(cls, buf: np.ndarray) -> "EntryBatch":
    raw = np.asarray(buf, np.uint8).tobytes()
    hlen = int(np.frombuffer(raw[:8], "<i8")[0])
    meta = json.loads(raw[8 : 8 + hlen].decode("utf-8"))
    n, d, off = len(meta["texts"]), meta["dim"], 8 + hlen
    emb = np.frombuffer(raw[off : off + 4 * n * d], "<f4").reshape(n, d)
    off += 4 * n * d
    scores = np.frombuffer(raw[off : off + 4 * n], "<f4")
    iters = np.frombuffer(raw[off + 4 * n : off + 12 * n], "<i8")
    if off + 12 * n != len(raw):
      raise ValueError(f"EntryBatch buffer has {len(raw)} bytes, expected {off + 12 * n}")
    return cls([tuple(s) for s in meta["slots"]], meta["texts"], scores, emb, iters)

  @classmethod
  def concat(cls, batches: Sequence["EntryBatch"], dim: int) -> "EntryBatch":
    return cls(
      [s for b in batches for s in b.slots],
      [t for b in batches for t in b.texts],
      np.concatenate([b.scores for b in batches] or [np.zeros(0)]),
      np.concatenate([b.embeddings.reshape(-1, dim) for b in batches] or [np.zeros((0, dim))]),
      np.concatenate([b.iterations for b in batches] or [np.zeros(0)]),
    )

  def add_to(self, store: MemoryStore) -> list[int | None]:
    return store.add_many(self.slots, self.texts, self.scores, self.embeddings, self.iterations)


def allgather_entries(batch: EntryBatch, dim: int) -> EntryBatch:
  """Every process's batch, concatenated in process order (identity with a single process)."""
  import jax

  if jax.process_count() == 1:
    return batch
  bufs = allgather_bytes(batch.to_bytes().tobytes())
  return EntryBatch.concat([EntryBatch.from_bytes(np.frombuffer(b, np.uint8)) for b in bufs], dim)


def gather_and_commit(
  store: MemoryStore, encoder, writes, iteration: int
) -> tuple[EntryBatch, list[int | None]]:
  """Embed this host's reflect.MemoryWrite list, gather all hosts' entries, add them all to `store`.

  Returns (the gathered batch, each gathered entry's uid or None for a rejected duplicate); both
  are the same on every host. Call it on every process, also with no writes.
  """
  emb = encoder.encode([w.key for w in writes]) if writes else np.zeros((0, store.dim), np.float32)
  local = EntryBatch(
    [w.slot for w in writes],
    [w.text for w in writes],
    [w.score for w in writes],
    emb,
    [iteration] * len(writes),
  )
  gathered = allgather_entries(local, store.dim)
  return gathered, gathered.add_to(store)
