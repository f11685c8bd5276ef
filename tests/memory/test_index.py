"""Retrieval: exact equality with a brute-force reference below the ScaNN size, recall above it."""

import numpy as np
import pytest

from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
from empo2_jax.memory.store import MemoryStore, normalize_rows

ROOMS = [
  "kitchen",
  "bathroom",
  "workshop",
  "art studio",
  "greenhouse",
  "hallway",
  "bedroom",
  "living room",
  "foundry",
  "outside",
]
OBJECTS = [
  "metal pot",
  "thermometer",
  "red wax",
  "orange",
  "apple seed",
  "flower pot 2",
  "battery",
  "light bulb",
  "wire",
  "solar panel",
  "blue paint",
  "yellow paint",
  "ice cube",
  "lead",
  "tin",
  "bee hive",
  "frog egg",
  "turtle",
  "axe",
  "sink",
  "stove",
  "freezer",
  "cup",
  "jug",
  "banana",
]
VERBS = [
  "pick up",
  "focus on",
  "open",
  "close",
  "look at",
  "activate",
  "deactivate",
  "move",
  "pour",
  "mix",
  "connect",
  "wait",
  "teleport to",
  "go to",
  "use",
]
TASKS = [
  "boil water",
  "melt the ice",
  "find a living thing",
  "grow an apple",
  "test the conductivity of tin",
  "mix paint to make green",
  "identify the life stages of a frog",
  "power the light bulb",
  "measure the melting point of lead",
  "find the animal with the longest life span",
]


def sciworld_texts(n: int, seed: int = 0) -> list[str]:
  """Varied ScienceWorld-like transcript snippets (task, room, objects, actions, scores)."""
  rng = np.random.default_rng(seed)

  def pick(xs):
    return xs[rng.integers(len(xs))]

  out, seen = [], set()
  while len(out) < n:
    kind = rng.integers(4)
    room, obj, obj2, verb = pick(ROOMS), pick(OBJECTS), pick(OBJECTS), pick(VERBS)
    if kind == 0:
      t = (
        f"user: Your task is to {pick(TASKS)}. This room is called the {room}. "
        f"assistant: {verb} {obj}"
      )
    elif kind == 1:
      t = (
        f"user: You are in the {room}. In it, you see: a {obj}, a {obj2}. "
        f"assistant: {verb} {obj} in {pick(ROOMS)}"
      )
    elif kind == 2:
      t = (
        f"Moving the {obj} to the {room} raised my score to {rng.integers(0, 101)}; "
        f"next I should {verb} the {obj2}."
      )
    else:
      state = pick(["hot", "cold", "liquid", "on", "off", "green"])
      t = f"user: The {obj} is now {state}. assistant: {verb} {obj2}"
    if t not in seen:
      seen.add(t)
      out.append(t)
  return out


def brute_force(emb_nd, scores, uids, q_md, threshold=0.5, k=10):
  """Reference: filter by cosine, stable sort by -score over write order, first k uids."""
  sims = normalize_rows(q_md) @ normalize_rows(emb_nd).T
  out = []
  for i in range(len(q_md)):
    passing = [j for j in range(len(uids)) if sims[i, j] > threshold]
    passing.sort(key=lambda j: (-scores[j], uids[j]))
    out.append([int(uids[j]) for j in passing[:k]])
  return out


def fill(store, key, emb, scores, start=0):
  for i, (e, s) in enumerate(zip(emb, scores)):
    assert store.add(key, f"tip {start + i}", float(s), e, iteration=i) is not None


def recall(got, ref):
  inter = sum(len(set(g) & set(r)) for g, r in zip(got, ref))
  return inter / max(1, sum(len(r) for r in ref))


def clustered(n, d=384, seed=0, spread=1.0):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(40, d))
  return (centers[rng.integers(0, 40, n)] + spread * rng.normal(size=(n, d))).astype(np.float32)


def test_exact_path_equals_brute_force_with_ties_and_eviction():
  rng = np.random.default_rng(1)
  emb = clustered(1500)
  scores = rng.integers(-100, 101, 1500).astype(np.float32) // 25 * 25  # many ties
  store = MemoryStore(max_per_slot=1000)
  fill(store, ("boil", 0), emb, scores)  # 500 evicted (FIFO)
  slot = store.slot(("boil", 0))
  assert len(slot) == 1000 and slot.oldest_uid == 500
  idx = MemoryIndex(store, RetrievalConfig())
  q = clustered(300, seed=0)[::-1] + 0.3 * rng.normal(size=(300, 384)).astype(np.float32)
  got = [[h.uid for h in hits] for hits in idx.search_batch([("boil", 0)] * 300, q)]
  ref = brute_force(slot.embeddings, slot.scores, slot.uids, q)
  assert got == ref
  assert sum(map(len, ref)) > 300 and any(len(r) == 10 for r in ref)
  assert idx.stats["exact"] == 300


def test_hits_carry_text_score_cosine_and_threshold_is_strict():
  store = MemoryStore(dim=4, max_per_slot=10)
  e = np.eye(4, dtype=np.float32)
  store.add(("t", 1), "low", -50, e[0], 0)
  store.add(("t", 1), "high", 90, e[0] + e[1] * 0.2, 0)
  store.add(("t", 1), "exactly half", 100, np.array([0.5, np.sqrt(0.75), 0, 0], np.float32), 0)
  store.add(("t", 1), "orthogonal", 100, e[2], 0)
  store.add(("t", 2), "other slot", 100, e[0], 0)
  idx = MemoryIndex(store)
  hits = idx.search(("t", 1), e[0] * 3.0)  # query need not be normalised
  assert [h.text for h in hits] == ["high", "low"]  # 0.5 is not > 0.5; ordered by score
  assert hits[0].score == 90 and hits[0].uid == 1
  np.testing.assert_allclose(hits[0].cosine, 1 / np.sqrt(1.04), rtol=1e-5)
  assert idx.search(("t", 9), e[0]) == []  # unknown slot
  assert idx.counts([("t", 1), ("t", 2), ("t", 3)], np.stack([e[0], e[0], e[0]])).tolist() == [
    2,
    1,
    0,
  ]


def test_top_k_and_new_entries_visible_immediately():
  store = MemoryStore(dim=4, max_per_slot=100)
  idx = MemoryIndex(store, RetrievalConfig(top_k=3))
  q = np.array([1, 0, 0, 0], np.float32)
  for i in range(6):
    store.add(("t", 0), f"m{i}", i % 3, q + 0.01 * i, 0)
    assert len(idx.search(("t", 0), q)) == min(i + 1, 3)
  assert [h.text for h in idx.search(("t", 0), q)] == ["m2", "m5", "m1"]


def test_scann_path_upkeep_tail_eviction_and_rebuild():
  rng = np.random.default_rng(2)
  emb = clustered(5700, seed=3)
  scores = rng.integers(-100, 101, 5700).astype(np.float32)
  store = MemoryStore(max_per_slot=5000)
  key = ("find-animal", 3)
  fill(store, key, emb[:4000], scores[:4000])
  # trained on a 1500-row sample, the other rows upserted 1000 at a time
  idx = MemoryIndex(store, RetrievalConfig(exact_max=1000, training_sample=1500, build_chunk=1000))
  q = clustered(300, seed=3)[::-1] + 0.3 * rng.normal(size=(300, 384)).astype(np.float32)

  def run():
    slot = store.slot(key)
    got = [[h.uid for h in hits] for hits in idx.search_batch([key] * len(q), q)]
    ref = brute_force(slot.embeddings, slot.scores, slot.uids, q)
    assert all(
      min(g, default=slot.oldest_uid) >= slot.oldest_uid for g in got
    )  # never an evicted uid
    return got, recall(got, ref), ref

  got, r, ref = run()
  assert r >= 0.85 and idx.stats["builds"] == 1 and idx.stats["ann"] > 0
  # written after the build (tail < 10% of the index): searched exactly, visible at once
  for j in range(300):
    assert store.add(key, f"exact copy of query {j}", 1000.0, q[j], iteration=1) == 4000 + j
  got, r, ref = run()

  def copies(lists):
    return [[u for u in x if u >= 4000] for x in lists]

  assert copies(got) == copies(ref) and all(copies(ref)) and idx.stats["builds"] == 1
  # 1400 more: 700 evicted + 1700 new > 10% of the index -> rebuilt from the live entries
  fill(store, key, emb[4000:5400], scores[4000:5400], start=4000)
  assert store.slot(key).oldest_uid == 700
  got, r, ref = run()
  assert idx.stats["builds"] == 2 and r >= 0.85
  for j, (g, c) in enumerate(zip(got, copies(ref))):  # the copies now come through ScaNN/scan
    assert 4000 + j in g or (len(c) == 10 and 4000 + j not in c)


@pytest.mark.slow
def test_scann_recall_on_minilm_embeddings_of_sciworld_texts():
  from empo2_jax.model.encoder import Encoder

  emb = Encoder.load(max_batch=64).encode(sciworld_texts(1600, seed=0))
  store_emb, q = emb[:1400], emb[1400:]
  scores = np.random.default_rng(0).integers(-100, 101, 1400).astype(np.float32)
  key = ("chemistry-mix", 0)
  store = MemoryStore(max_per_slot=10_000)
  fill(store, key, store_emb, scores)
  slot = store.slot(key)
  # 0.5: hundreds of neighbours pass (score-order scan); 0.7: tens pass (ScaNN candidates,
  # re-scored)
  for thr, path in ((0.5, "scan"), (0.7, "ann")):
    idx = MemoryIndex(store, RetrievalConfig(threshold=thr, exact_max=500))
    got = [[h.uid for h in hits] for hits in idx.search_batch([key] * len(q), q)]
    ref = brute_force(slot.embeddings, slot.scores, slot.uids, q, threshold=thr)
    assert sum(map(len, ref)) > 5 * len(q)
    assert recall(got, ref) >= 0.95, (thr, recall(got, ref), idx.stats)
    assert idx.stats[path] > len(q) // 2, idx.stats
    exact = MemoryIndex(store, RetrievalConfig(threshold=thr))  # below the ScaNN size: identical
    assert [[h.uid for h in hits] for hits in exact.search_batch([key] * len(q), q)] == ref


def test_short_scann_answers_are_not_padded_hits():
  rng = np.random.default_rng(4)
  emb = rng.normal(size=(300, 384)).astype(np.float32)
  store = MemoryStore(max_per_slot=1000)
  fill(store, ("t", 0), emb, rng.integers(-100, 101, 300))
  # one searched leaf returns far fewer than `candidates`; ScaNN pads with index 0 (uid 0)
  idx = MemoryIndex(
    store, RetrievalConfig(exact_max=50, candidates=256, search_fraction=0.2, saturation=2.0)
  )
  q = emb[:20] + 0.1 * rng.normal(size=(20, 384)).astype(np.float32)
  found = 0
  for j, hits in enumerate(idx.search_batch([("t", 0)] * 20, q)):
    uids = [h.uid for h in hits]
    assert len(set(uids)) == len(uids)
    found += j in uids
  assert found >= 15
  assert idx.stats["ann"] == 20


def test_without_scann_falls_back_to_exact_with_one_warning(monkeypatch):
  from empo2_jax.memory import index as index_mod

  monkeypatch.setattr(index_mod, "_scann", None)
  monkeypatch.setattr(index_mod, "_warned_no_scann", False)
  emb = clustered(600, seed=5)
  scores = np.arange(600, dtype=np.float32) % 7
  store = MemoryStore(max_per_slot=1000)
  fill(store, ("t", 0), emb, scores)
  idx = MemoryIndex(store, RetrievalConfig(exact_max=100))
  q = clustered(50, seed=5)
  with pytest.warns(RuntimeWarning, match="scann could not be imported"):
    got = [[h.uid for h in hits] for hits in idx.search_batch([("t", 0)] * 50, q)]
  slot = store.slot(("t", 0))
  assert got == brute_force(slot.embeddings, slot.scores, slot.uids, q)
  import warnings

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    idx.search(("t", 0), q[0])
  assert idx.stats["exact"] == 51 and idx.stats["builds"] == 0
