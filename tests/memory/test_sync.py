"""Multi-host gather of new memory entries, single process (two:
test_memory_sync_multiprocess.py)."""

import numpy as np
import pytest

from empo2_jax.memory.reflect import MemoryWrite
from empo2_jax.memory.store import MemoryStore
from empo2_jax.memory.sync import EntryBatch, allgather_bytes, allgather_entries, gather_and_commit


def batch(n=3, d=5, seed=0):
  rng = np.random.default_rng(seed)
  return EntryBatch(
    [("boil", i % 2) for i in range(n)],
    [f"tip ✓ {i}" for i in range(n)],
    rng.normal(size=n),
    rng.normal(size=(n, d)),
    np.arange(n) + 7,
  )


def test_bytes_round_trip_and_concat():
  b = batch()
  r = EntryBatch.from_bytes(b.to_bytes())
  assert r.slots == b.slots and r.texts == b.texts
  np.testing.assert_array_equal(r.embeddings, b.embeddings)
  np.testing.assert_array_equal(r.scores, b.scores)
  np.testing.assert_array_equal(r.iterations, b.iterations)
  empty = EntryBatch.from_bytes(EntryBatch([], [], [], np.zeros((0, 5)), []).to_bytes())
  assert len(empty) == 0
  c = EntryBatch.concat([b, empty, batch(seed=1)], dim=5)
  assert len(c) == 6 and c.texts[3:] == batch(seed=1).texts
  with pytest.raises(ValueError):
    EntryBatch.from_bytes(np.concatenate([b.to_bytes(), np.zeros(3, np.uint8)]))


def test_single_process_gather_is_identity_and_commit_adds():
  b = batch()
  assert allgather_entries(b, 5) is b

  class FakeEncoder:
    def encode(self, texts):
      return np.stack([np.arange(4, dtype=np.float32) + len(t) for t in texts])

  store = MemoryStore(dim=4)
  writes = [MemoryWrite(("t", 0), "a", 1.0, "key one"), MemoryWrite(("t", 0), "b", 2.0, "key")]
  g, uids = gather_and_commit(store, FakeEncoder(), writes, iteration=3)
  assert g.texts == ["a", "b"] and store.slot(("t", 0)).texts == ["a", "b"]
  assert uids == list(store.slot(("t", 0)).uids)
  assert store.slot(("t", 0)).iterations.tolist() == [3, 3]
  g, uids = gather_and_commit(store, FakeEncoder(), writes[:1], iteration=4)
  assert g.texts == ["a"] and uids == [None]  # a duplicate text is rejected
  g, uids = gather_and_commit(store, FakeEncoder(), [], iteration=4)
  assert len(g) == 0 and uids == []


def test_single_process_allgather_bytes_is_identity():
  assert allgather_bytes(b"\x00abc") == [b"\x00abc"]
  assert allgather_bytes(b"") == [b""]
