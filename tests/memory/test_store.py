"""Memory store: FIFO, dedup, state dict, atomic save/restore and torn saves."""

import json
import os

import numpy as np
import pytest

from empo2_jax.memory import store as store_mod
from empo2_jax.memory.store import MemoryStore


def unit(rng, d=8):
  v = rng.normal(size=d).astype(np.float32)
  return v / np.linalg.norm(v)


def filled(seed=0, n=25, max_per_slot=10):
  rng = np.random.default_rng(seed)
  s = MemoryStore(dim=8, max_per_slot=max_per_slot)
  for i in range(n):
    s.add(("boil", i % 2), f"tip {i} ünïcode ✓", float(i - 12), unit(rng), iteration=i // 5)
  s.add(("melt", 7), "only one", 100.0, unit(rng), iteration=3)
  return s


def assert_same(a: MemoryStore, b: MemoryStore):
  assert a.keys() == b.keys() and a.max_per_slot == b.max_per_slot and a.dim == b.dim
  for k in a.keys():
    x, y = a.slot(k), b.slot(k)
    assert x.texts == y.texts
    assert x.uids.tolist() == y.uids.tolist()
    np.testing.assert_array_equal(x.embeddings, y.embeddings)
    np.testing.assert_array_equal(x.scores, y.scores)
    np.testing.assert_array_equal(x.iterations, y.iterations)


def test_fifo_eviction_keeps_newest_in_order():
  rng = np.random.default_rng(0)
  s = MemoryStore(dim=8, max_per_slot=5)
  embs = [unit(rng) for _ in range(12)]
  for i in range(12):
    assert s.add(("t", 0), f"m{i}", i, embs[i], iteration=i) == i
  slot = s.slot(("t", 0))
  assert len(slot) == 5 and slot.texts == [f"m{i}" for i in range(7, 12)]
  assert slot.uids.tolist() == list(range(7, 12)) and slot.scores.tolist() == list(range(7, 12))
  np.testing.assert_allclose(slot.embeddings, np.stack(embs[7:]), atol=1e-6)
  assert slot.text(9) == "m9"
  with pytest.raises(KeyError):
    slot.text(6)
  # an evicted text may be written again (dedup is over live entries, as in the reference code)
  assert s.add(("t", 0), "m0", 0, embs[0], 12) == 12


def test_large_slot_compaction_keeps_order():
  rng = np.random.default_rng(1)
  s = MemoryStore(dim=4, max_per_slot=1000)
  for i in range(3500):
    s.add(("t", 0), f"x{i}", i, rng.normal(size=4), 0)
  slot = s.slot(("t", 0))
  assert slot.texts == [f"x{i}" for i in range(2500, 3500)] and slot.oldest_uid == 2500
  assert slot.scores.tolist() == list(range(2500, 3500))
  assert len(slot._score) <= 1501  # capacity stays bounded by 1.5 x max


def test_dedup_exact_text_per_slot():
  rng = np.random.default_rng(0)
  s = MemoryStore(dim=8)
  assert s.add(("t", 0), "same", 1, unit(rng), 0) == 0
  assert s.add(("t", 0), "same", 99, unit(rng), 1) is None
  assert s.add(("t", 0), "same ", 1, unit(rng), 0) == 1  # exact match only
  assert s.add(("t", 1), "same", 1, unit(rng), 0) == 0  # other slot
  assert len(s) == 3 and s.slot(("t", 0)).scores.tolist() == [1, 1]
  uids = s.add_many([("t", 2)] * 3, ["a", "b", "a"], [1, 2, 3], np.stack([unit(rng)] * 3), 4)
  assert uids == [0, 1, None]


def test_embeddings_normalised_and_validated():
  s = MemoryStore(dim=3)
  s.add(("t", 0), "x", 0, [3.0, 0, 4.0], 0)
  np.testing.assert_allclose(s.slot(("t", 0)).embeddings[0], [0.6, 0, 0.8], rtol=1e-6)
  with pytest.raises(ValueError, match="dim 3"):
    s.add(("t", 0), "y", 0, np.ones(4), 0)
  with pytest.raises(ValueError, match="non-empty"):
    s.add(("t", 0), "", 0, np.ones(3), 0)


def test_state_dict_round_trip_keeps_uids_and_fifo():
  s = filled()
  state = s.state_dict()
  assert all(isinstance(v, np.ndarray) for v in state.values())
  r = MemoryStore.from_state_dict({k: v.copy() for k, v in state.items()})
  assert_same(s, r)
  rng = np.random.default_rng(5)  # continues identically after restore
  e = unit(rng)
  assert s.add(("boil", 0), "new", 1, e, 9) == r.add(("boil", 0), "new", 1, e, 9) == 13
  assert (
    s.add(("boil", 0), "tip 24 ünïcode ✓", 1, e, 9)
    is r.add(("boil", 0), "tip 24 ünïcode ✓", 1, e, 9)
    is None
  )
  assert_same(s, r)
  empty = MemoryStore.from_state_dict(MemoryStore(dim=8).state_dict())
  assert empty.keys() == [] and empty.dim == 8


def test_save_load_round_trip(tmp_path):
  s = filled()
  manifest = s.save(tmp_path / "mem")
  assert manifest.name == "memory.json"
  meta = json.loads(manifest.read_text())
  assert meta["slots"][0] == {"task": "boil", "variation": 0, "count": 10, "next_uid": 13}
  assert_same(s, MemoryStore.load(tmp_path / "mem"))
  s.add(("melt", 7), "second", 5.0, np.ones(8), 4)
  s.save(tmp_path / "mem")  # overwrite: old npz removed
  assert sorted(p.name for p in (tmp_path / "mem").iterdir()) == ["memory-1.npz", "memory.json"]
  assert_same(s, MemoryStore.load(tmp_path / "mem"))
  with pytest.raises(FileNotFoundError, match="MemoryStore.save"):
    MemoryStore.load(tmp_path / "nothing")


def test_crash_mid_save_leaves_previous_copy_loadable(tmp_path, monkeypatch):
  old = filled(seed=0)
  old.save(tmp_path)
  new = filled(seed=1, n=40)

  # crash while the npz is half written
  real_savez = np.savez

  def torn_savez(f, **arrays):
    real_savez(f, **arrays)
    f.truncate(100)
    raise OSError("disk died")

  monkeypatch.setattr(store_mod.np, "savez", torn_savez)
  with pytest.raises(OSError):
    new.save(tmp_path)
  monkeypatch.setattr(store_mod.np, "savez", real_savez)
  assert_same(old, MemoryStore.load(tmp_path))
  assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

  # crash after the new npz is in place but before the manifest is replaced
  real_replace = os.replace

  def crash_on_manifest(src, dst):
    if str(dst).endswith("memory.json"):
      raise OSError("power cut")
    real_replace(src, dst)

  monkeypatch.setattr(store_mod.os, "replace", crash_on_manifest)
  with pytest.raises(OSError):
    new.save(tmp_path)
  monkeypatch.setattr(store_mod.os, "replace", real_replace)
  assert (tmp_path / "memory-1.npz").exists()
  assert_same(old, MemoryStore.load(tmp_path))
  new.save(tmp_path)  # the next save succeeds and wins
  assert_same(new, MemoryStore.load(tmp_path))


def test_corrupt_npz_is_detected(tmp_path):
  filled().save(tmp_path)
  npz = tmp_path / "memory-0.npz"
  data = bytearray(npz.read_bytes())
  data[len(data) // 2] ^= 0xFF
  npz.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="checksum"):
    MemoryStore.load(tmp_path)
