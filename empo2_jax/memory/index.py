"""Retrieval over the tip memory (docs/method.md §3): entries with cosine > threshold, best stored
score first.

The answer for a query q over a slot is: every live entry with cos(q, key) > `threshold`, sorted by
stored score descending, ties by uid ascending (oldest first, as a stable sort over the FIFO list
gives), the first `top_k`. Two ways to get it:

- exact (slots with at most `exact_max` entries, or when scann is missing): one matmul over the
slot;
  scanning the slot in (score, uid) order and keeping the first `top_k` passes is the exact answer.
- approximate, for larger slots: a ScaNN tree + asymmetric-hashing searcher returns `candidates`
  neighbours per query, whose cosines are recomputed exactly from the stored embeddings (so the
  threshold test is exact; only neighbours ScaNN misses can be lost). When more than `saturation` of
  the candidates pass ("saturated": the passing set is dense, and may be larger than `candidates`,
  as
  when all keys of a slot share a long prompt), the query switches to an exact scan of the slot in
  score order, in growing chunks, stopping as soon as `top_k` passes are found -- cheap exactly when
  passes are dense. Range queries need a wide tree search (`search_fraction` 0.3 of the leaves) for
  recall >= 0.95 on MiniLM keys; tests/memory/test_index.py measures it.

Index upkeep (rebuild policy): a slot's ScaNN searcher covers the uid range [lo, hi) that was live
when
it was built. Entries written later (uid >= hi, "tail") are searched exactly on every query; evicted
entries (uid < oldest live uid) are dropped from ScaNN's answers. The searcher is rebuilt from the
live
entries before a query when tail + evicted > `rebuild_fraction` x indexed size, so the exact share
of
the work stays bounded and dead entries never crowd out live ones for long. A build trains the tree
and AH codebooks on a random `training_sample` of the slot and upserts the rest in `build_chunk`s,
which keeps ScaNN's transient memory small (a one-shot build copies the data about twice).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import Counter
from typing import Sequence

import numpy as np

from empo2_jax.memory.store import MemoryStore, Slot, SlotKey, normalize_rows

try:  # ScaNN's pybind searcher (no TensorFlow); optional at import time
  from scann import scann_ops_pybind as _scann
except Exception as _e:  # noqa: BLE001 - any import failure means "no scann"
  _scann, _SCANN_ERROR = None, _e
else:
  _SCANN_ERROR = None
_warned_no_scann = False


UNSEEN_FALLBACKS = ("task", "none")


@dataclasses.dataclass(frozen=True)
class RetrievalConfig:
  threshold: float = 0.5  # cosine must be strictly greater
  top_k: int = 10
  exact_max: int = 20_000  # slots up to this size are searched exactly
  candidates: int = 256  # ScaNN neighbours per query, re-scored exactly
  saturation: float = (
    0.25  # share of candidates passing above which the exact score-order scan runs
  )
  rebuild_fraction: float = (
    0.1  # rebuild when (tail + evicted) exceeds this share of the indexed size
  )
  leaves_per_sqrt_n: float = 1.0  # ScaNN tree leaves = this x sqrt(n)
  search_fraction: float = 0.3  # share of leaves searched per query (range queries need many)
  training_sample: int = 100_000  # ScaNN k-means / AH training sample size (built first)
  build_chunk: int = 50_000  # rows upserted into the searcher per step after the sample
  scan_chunk: int = 16_384  # max rows per step of the score-order scan (starts at 256, doubles)
  use_scann: bool = True
  # memory.unseen_fallback: "task" lets a variation without a slot of its own read its task's
  # other slots where the caller asks (evaluation with memory, launch/adapt.py); "none" never
  unseen_fallback: str = "task"

  def __post_init__(self):
    if self.unseen_fallback not in UNSEEN_FALLBACKS:
      raise ValueError(
        f"memory.unseen_fallback={self.unseen_fallback!r}; valid: task (evaluation with memory "
        "and launch/adapt.py read the task's other slots), none"
      )


@dataclasses.dataclass(frozen=True)
class Hit:
  uid: int
  text: str
  score: float
  cosine: float


@dataclasses.dataclass
class _Ann:
  slot: Slot
  searcher: object  # scann_ops_pybind.ScannSearcher; its internal index j is row pos_of[j]
  pos_of: np.ndarray  # [n] ScaNN internal index -> position from lo
  lo: int  # first indexed uid
  hi: int  # one past the last indexed uid
  rank_uids: np.ndarray  # indexed uids sorted by (-score, uid)


def _sims(q_md: np.ndarray, emb_nd: np.ndarray) -> np.ndarray:
  """Cosines [m, n] of unit rows; one query goes through gemv, which is ~3x faster than a 1-row
  gemm."""
  if len(q_md) == 1:
    return (emb_nd @ q_md[0])[None]
  return q_md @ emb_nd.T


def _score_order(scores: np.ndarray, uids: np.ndarray) -> np.ndarray:
  return np.lexsort((uids, -scores.astype(np.float64)))


class MemoryIndex:
  """Retrieval over a MemoryStore; reads the store's slots directly, so writes show up
  immediately."""

  def __init__(self, store: MemoryStore, cfg: RetrievalConfig = RetrievalConfig()):
    self.store, self.cfg = store, cfg
    self._ann: dict[SlotKey, _Ann] = {}
    self._order: dict[SlotKey, tuple] = {}
    self.stats: Counter = Counter()  # queries per path ("exact", "ann", "scan") and "builds"

  # -- public
  # ---------------------------------------------------------------------------------------
  def search(self, key, query_d: np.ndarray) -> list[Hit]:
    return self.search_batch([key], np.asarray(query_d, np.float32).reshape(1, -1))[0]

  def search_batch(self, keys: Sequence, queries_nd: np.ndarray) -> list[list[Hit]]:
    """One hit list per query; query i searches slot keys[i]."""
    if not len(keys):
      return []
    q = normalize_rows(np.asarray(queries_nd, np.float32).reshape(len(keys), -1))
    out: list[list[Hit]] = [[] for _ in keys]
    groups: dict[SlotKey, list[int]] = {}
    for i, k in enumerate(keys):
      groups.setdefault(self.store.slot_key(k), []).append(i)
    for key, rows in groups.items():
      slot = self.store.slot(key)
      if slot is None or len(slot) == 0:
        continue
      found = self._search_slot(key, slot, q[rows])
      for i, pairs in zip(rows, found):
        out[i] = [
          Hit(int(u), slot.text(int(u)), float(slot.scores[u - slot.oldest_uid]), float(c))
          for u, c in pairs
        ]
    return out

  def counts(self, keys: Sequence, queries_nd: np.ndarray) -> np.ndarray:
    """Number of memories retrieved per query (the n of the intrinsic reward)."""
    return np.array([len(h) for h in self.search_batch(keys, queries_nd)], np.int32)

  # -- dispatch
  # -------------------------------------------------------------------------------------
  def _search_slot(self, key, slot: Slot, q_md: np.ndarray) -> list[list[tuple[int, float]]]:
    if len(slot) <= self.cfg.exact_max or not self._scann_ok():
      self._ann.pop(key, None)
      self.stats["exact"] += len(q_md)
      return self._exact(key, slot, q_md)
    return self._approx(key, slot, q_md)

  def _scann_ok(self) -> bool:
    global _warned_no_scann
    if not self.cfg.use_scann:
      return False
    if _scann is None and not _warned_no_scann:
      warnings.warn(
        f"scann could not be imported ({_SCANN_ERROR}); memory retrieval falls back to "
        "exact numpy search, which is slow for large slots",
        RuntimeWarning,
      )
      _warned_no_scann = True
    return _scann is not None

  # -- exact
  # ------------------------------------------------------------------------------------------
  def _exact(self, key, slot: Slot, q_md):
    cached = self._order.get(key)
    if cached is None or cached[0] is not slot or cached[1:3] != (slot.oldest_uid, slot.next_uid):
      cached = (slot, slot.oldest_uid, slot.next_uid, _score_order(slot.scores, slot.uids))
      self._order[key] = cached
    order = cached[3]
    sims_mn = _sims(q_md, slot.embeddings)
    passing_mn = sims_mn[:, order] > self.cfg.threshold
    out = []
    for i in range(len(q_md)):
      pos = order[np.flatnonzero(passing_mn[i])[: self.cfg.top_k]]
      out.append([(slot.oldest_uid + p, sims_mn[i, p]) for p in pos])
    return out

  # -- approximate
  # ------------------------------------------------------------------------------------
  def _ann_for(self, key, slot: Slot) -> _Ann:
    a = self._ann.get(key)
    if a is not None and a.slot is slot:
      stale = max(0, slot.oldest_uid - a.lo) + (slot.next_uid - a.hi)
      if stale <= self.cfg.rebuild_fraction * (a.hi - a.lo):
        return a
    a = self._ann[key] = self._build(slot)
    return a

  def _build(self, slot: Slot) -> _Ann:
    """Train the tree + AH codebooks on a random sample, then upsert the rest in chunks.

    Building from the sample and upserting keeps ScaNN's transient copies to ~a chunk instead of
    ~2x the whole slot (about 3 GB at 1M x 384 float32).
    """
    cfg, emb = self.cfg, slot.embeddings
    n = len(emb)
    m = min(n, cfg.training_sample)
    first = np.sort(np.random.default_rng(n).choice(n, m, replace=False)) if m < n else np.arange(n)
    rest = np.setdiff1d(np.arange(n), first, assume_unique=True)
    leaves = max(8, min(n // 20, int(cfg.leaves_per_sqrt_n * math.sqrt(n))))
    searcher = (
      _scann.builder(np.ascontiguousarray(emb[first]), cfg.candidates, "dot_product")
      .tree(
        num_leaves=leaves,
        num_leaves_to_search=max(1, math.ceil(leaves * cfg.search_fraction)),
        training_sample_size=m,
        spherical=True,
      )
      .score_ah(2, anisotropic_quantization_threshold=0.2)
      .build(docids=[str(j) for j in range(m)])
    )
    for c in range(0, len(rest), cfg.build_chunk):
      part = rest[c : c + cfg.build_chunk]
      searcher.upsert(
        [str(m + c + j) for j in range(len(part))],
        np.ascontiguousarray(emb[part]),
        batch_size=len(part),
      )
    self.stats["builds"] += 1
    uids = slot.uids
    return _Ann(
      slot,
      searcher,
      np.concatenate([first, rest]).astype(np.int64),
      int(uids[0]),
      int(uids[-1]) + 1,
      uids[_score_order(slot.scores, uids)],
    )

  def _approx(self, key, slot: Slot, q_md):
    cfg, a = self.cfg, self._ann_for(key, slot)
    emb, base = slot.embeddings, slot.oldest_uid
    k_cand = min(cfg.candidates, a.hi - a.lo)
    # the raw pybind searcher answers internal indices (the wrapper would map them to docid strings)
    idx_mc, dist_mc = a.searcher.searcher.search_batched(q_md, k_cand, -1, -1, False, 0)
    uids_mc = a.lo + a.pos_of[np.asarray(idx_mc, np.int64)]
    found_mc = np.isfinite(np.asarray(dist_mc))  # ScaNN pads short answers with index 0, NaN
    tail_u = np.arange(max(a.hi, base), slot.next_uid, dtype=np.int64)
    tail_sims = (
      _sims(q_md, emb[tail_u - base]) if len(tail_u) else np.zeros((len(q_md), 0), np.float32)
    )
    results, saturated = [None] * len(q_md), []
    for i in range(len(q_md)):
      u = uids_mc[i][found_mc[i] & (uids_mc[i] >= base)]
      cos = emb[u - base] @ q_md[i]
      keep = cos > cfg.threshold
      t_keep = tail_sims[i] > cfg.threshold
      tail_pairs = (tail_u[t_keep], tail_sims[i][t_keep])
      if keep.sum() >= cfg.saturation * k_cand:
        saturated.append((i, tail_pairs))
        continue
      results[i] = self._top_by_score(
        slot, np.concatenate([u[keep], tail_pairs[0]]), np.concatenate([cos[keep], tail_pairs[1]])
      )
    self.stats["ann"] += len(q_md) - len(saturated)
    self.stats["scan"] += len(saturated)
    if saturated:
      scanned = self._scan(slot, a, q_md[[i for i, _ in saturated]])
      for (i, (tu, tc)), (su, sc) in zip(saturated, scanned):
        results[i] = self._top_by_score(slot, np.concatenate([su, tu]), np.concatenate([sc, tc]))
    return results

  def _top_by_score(self, slot: Slot, uids, cos):
    uids = np.asarray(uids, np.int64)
    order = _score_order(slot.scores[uids - slot.oldest_uid], uids)[: self.cfg.top_k]
    return [(uids[j], cos[j]) for j in order]

  def _scan(self, slot: Slot, a: _Ann, q_md):
    """Exact: walk the indexed uids in (score, uid) order; stop when every query has top_k
    passes."""
    cfg, base, emb = self.cfg, slot.oldest_uid, slot.embeddings
    got_u = [[] for _ in q_md]
    got_c = [[] for _ in q_md]
    active = np.arange(len(q_md))
    c0, size = 0, min(256, cfg.scan_chunk)  # chunks double: dense passes stop after a few rows
    while c0 < len(a.rank_uids):
      u = a.rank_uids[c0 : c0 + size]
      c0, size = c0 + size, min(2 * size, cfg.scan_chunk)
      u = u[u >= base]
      sims_ac = _sims(q_md[active], emb[u - base])
      still = []
      for j, i in enumerate(active):
        need = cfg.top_k - len(got_u[i])
        hit = np.flatnonzero(sims_ac[j] > cfg.threshold)[:need]
        got_u[i].extend(u[hit])
        got_c[i].extend(sims_ac[j, hit])
        if len(got_u[i]) < cfg.top_k:
          still.append(i)
      active = np.array(still, np.int64)
      if not len(active):
        break
    return [(np.array(gu, np.int64), np.array(gc, np.float32)) for gu, gc in zip(got_u, got_c)]
