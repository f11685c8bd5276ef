"""Tip memory: one FIFO list per (task, variation) slot, persisted as plain files (docs/method.md
§3).

Each entry holds the stored text (tip + action + score, see reflect.py), the score used to rank it
(the episode return), the L2-normalised key embedding (MiniLM of the transcript) and the training
iteration that wrote it. Every entry of a slot gets a running id `uid` (0, 1, 2, ... in write order,
never reused); FIFO eviction removes the lowest uids, so the live uids of a slot are always the
range
[oldest_uid, next_uid). Exact duplicate texts (among the live entries of the slot) are rejected.

Persistence: `state_dict()` is a flat dict of numpy arrays (meta as UTF-8 JSON bytes) that a
checkpoint
can carry; `save(dir)` writes it as `memory-<n>.npz` + the manifest `memory.json` (naming that npz
and
its sha256). The manifest replace is the commit point: every file is written to a temp name, fsynced
and `os.replace`d, older npz files are deleted only after the new manifest is durable, so a crash at
any moment leaves the previous (or the new) memory loadable.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

SlotKey = tuple[str, int]  # (task name, variation index)
FORMAT_VERSION = 1
MANIFEST = "memory.json"


def normalize_rows(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class Slot:
  """Entries of one slot in growable arrays; row r holds uid `base_uid + r`, live rows [first, n).

  Eviction only advances `first`; the arrays (and the row-aligned text list) are compacted when they
  run out of room, so an add is amortised O(1) and the live views below are plain slices.
  """

  def __init__(self, dim: int, max_entries: int):
    if max_entries < 1:
      raise ValueError(f"max_entries must be >= 1, got {max_entries}")
    self.dim, self.max_entries = dim, max_entries
    cap = min(max_entries, 64)
    self._emb = np.zeros((cap, dim), np.float32)
    self._score = np.zeros(cap, np.float32)
    self._iter = np.zeros(cap, np.int64)
    self._texts: list[str | None] = []  # row-aligned; evicted rows hold None until compaction
    self._first = 0
    self._n = 0
    self.base_uid = 0
    self._live_texts: set[str] = set()

  # -- views over live entries (position p <-> uid oldest_uid + p)
  # ----------------------------------
  def __len__(self) -> int:
    return self._n - self._first

  @property
  def oldest_uid(self) -> int:
    return self.base_uid + self._first

  @property
  def next_uid(self) -> int:
    return self.base_uid + self._n

  @property
  def embeddings(self) -> np.ndarray:  # [len, dim] view, unit rows
    return self._emb[self._first : self._n]

  @property
  def scores(self) -> np.ndarray:  # [len] float32
    return self._score[self._first : self._n]

  @property
  def iterations(self) -> np.ndarray:  # [len] int64
    return self._iter[self._first : self._n]

  @property
  def texts(self) -> list[str]:
    return self._texts[self._first : self._n]

  @property
  def uids(self) -> np.ndarray:
    return np.arange(self.oldest_uid, self.next_uid, dtype=np.int64)

  def positions(self, uids) -> np.ndarray:
    """Positions (into the live views) of live uids."""
    return np.asarray(uids, np.int64) - self.oldest_uid

  def text(self, uid: int) -> str:
    if not self.oldest_uid <= uid < self.next_uid:
      raise KeyError(f"uid {uid} is not live (live range [{self.oldest_uid}, {self.next_uid}))")
    return self._texts[uid - self.base_uid]

  def __contains__(self, text: str) -> bool:
    return text in self._live_texts

  # -- mutation ------------------------------------------------------------------------------------
  def add(self, text: str, score: float, emb_d: np.ndarray, iteration: int) -> int | None:
    """Append one entry; returns its uid, or None for a duplicate text. Evicts the oldest past
    max."""
    if text in self._live_texts:
      return None
    if len(self) >= self.max_entries:
      self._live_texts.discard(self._texts[self._first])
      self._texts[self._first] = None
      self._first += 1
    if self._n == len(self._score):
      self._make_room()
    r = self._n
    self._emb[r] = emb_d
    self._score[r] = score
    self._iter[r] = iteration
    self._texts.append(text)
    self._live_texts.add(text)
    self._n += 1
    return self.base_uid + r

  def _make_room(self) -> None:
    live = len(self)
    if self._first > 0 and self._first >= live // 2:  # compact: O(live) once per >= live/2 adds
      sl = slice(self._first, self._n)
      self._emb[:live] = self._emb[sl]
      self._score[:live] = self._score[sl]
      self._iter[:live] = self._iter[sl]
      self._texts = self._texts[sl]
      self.base_uid += self._first
      self._first, self._n = 0, live
      return
    cap = max(min(2 * len(self._score), self.max_entries + self.max_entries // 2 + 1), self._n + 1)

    def grow(a):
      return np.concatenate([a, np.zeros((cap - len(a),) + a.shape[1:], a.dtype)])

    self._emb, self._score, self._iter = grow(self._emb), grow(self._score), grow(self._iter)


class MemoryStore:
  """All slots. `add(...)` writes one entry; `state_dict()` / `save(dir)` persist everything."""

  def __init__(self, dim: int = 384, max_per_slot: int = 1000):
    self.dim, self.max_per_slot = int(dim), int(max_per_slot)
    self._slots: dict[SlotKey, Slot] = {}

  @staticmethod
  def slot_key(key) -> SlotKey:
    task, variation = key
    return (str(task), int(variation))

  def slot(self, key) -> Slot | None:
    return self._slots.get(self.slot_key(key))

  def keys(self) -> list[SlotKey]:
    return sorted(self._slots)

  def __len__(self) -> int:
    return sum(len(s) for s in self._slots.values())

  def add(self, key, text: str, score: float, embedding_d, iteration: int) -> int | None:
    """Returns the new entry's uid in its slot, or None when the text is already in that slot."""
    if not isinstance(text, str) or not text:
      raise ValueError(f"memory text must be a non-empty string, got {text!r}")
    emb = normalize_rows(np.asarray(embedding_d, np.float32).reshape(-1))
    if emb.shape != (self.dim,):
      raise ValueError(f"embedding has shape {emb.shape}, the store holds dim {self.dim}")
    key = self.slot_key(key)
    slot = self._slots.get(key)
    if slot is None:
      slot = self._slots[key] = Slot(self.dim, self.max_per_slot)
    return slot.add(text, float(score), emb, int(iteration))

  def add_many(
    self,
    keys: Sequence,
    texts: Sequence[str],
    scores: Sequence[float],
    embeddings_nd: np.ndarray,
    iterations: Sequence[int] | int,
  ) -> list[int | None]:
    """Write entries in order; returns each one's uid (None for rejected duplicates)."""
    n = len(texts)
    its = [int(iterations)] * n if np.isscalar(iterations) else list(iterations)
    embeddings_nd = np.asarray(embeddings_nd, np.float32).reshape(n, self.dim)
    if not (len(keys) == len(scores) == len(its) == n):
      raise ValueError("add_many: keys, texts, scores, embeddings and iterations differ in length")
    return [
      self.add(k, t, s, e, i) for k, t, s, e, i in zip(keys, texts, scores, embeddings_nd, its)
    ]

  # -- state dict (for checkpoints) ----------------------------------------------------------------
  def state_dict(self) -> dict[str, np.ndarray]:
    """Flat dict of numpy arrays: all live entries slot by slot; `meta_json` is UTF-8 JSON bytes."""
    keys = self.keys()
    slots = [self._slots[k] for k in keys]
    texts = [t.encode("utf-8") for s in slots for t in s.texts]
    lengths = np.array([len(t) for t in texts], np.int64)
    meta = {
      "version": FORMAT_VERSION,
      "dim": self.dim,
      "max_per_slot": self.max_per_slot,
      "slots": [
        {"task": k[0], "variation": k[1], "count": len(s), "next_uid": s.next_uid}
        for k, s in zip(keys, slots)
      ],
    }

    def cat(xs, dt, shape):
      return np.concatenate(xs).astype(dt) if xs else np.zeros(shape, dt)

    return {
      "meta_json": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8).copy(),
      "embeddings": cat([s.embeddings for s in slots], np.float32, (0, self.dim)),
      "scores": cat([s.scores for s in slots], np.float32, (0,)),
      "iterations": cat([s.iterations for s in slots], np.int64, (0,)),
      "text_bytes": np.frombuffer(b"".join(texts), np.uint8).copy(),
      "text_offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    }

  @classmethod
  def from_state_dict(cls, state: dict) -> "MemoryStore":
    meta = json.loads(np.asarray(state["meta_json"], np.uint8).tobytes().decode("utf-8"))
    if meta.get("version") != FORMAT_VERSION:
      raise ValueError(
        f"memory state has format version {meta.get('version')}, this code reads {FORMAT_VERSION}"
      )
    store = cls(dim=meta["dim"], max_per_slot=meta["max_per_slot"])
    emb = np.asarray(state["embeddings"], np.float32)
    scores, its = np.asarray(state["scores"]), np.asarray(state["iterations"])
    blob, offs = (
      np.asarray(state["text_bytes"], np.uint8).tobytes(),
      np.asarray(state["text_offsets"]),
    )
    row = 0
    for s in meta["slots"]:
      key, count = (s["task"], s["variation"]), s["count"]
      slot = store._slots[key] = Slot(store.dim, store.max_per_slot)
      slot.base_uid = s["next_uid"] - count  # keep uids stable across save/restore
      for r in range(row, row + count):
        text = blob[offs[r] : offs[r + 1]].decode("utf-8")
        if slot.add(text, float(scores[r]), emb[r], int(its[r])) is None:
          raise ValueError(f"memory state has a duplicate text in slot {key}: {text[:80]!r}")
      row += count
    if row != len(scores):
      raise ValueError(f"memory state lists {row} entries in its slots but holds {len(scores)}")
    return store

  # -- files
  # -----------------------------------------------------------------------------------------
  def save(self, directory: str | os.PathLike) -> Path:
    """Atomically write `memory.json` + `memory-<n>.npz` under `directory`; returns the manifest
    path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = self.state_dict()
    meta_json = state.pop("meta_json")
    prev = _read_manifest(d) if (d / MANIFEST).exists() else None
    gen = (prev["generation"] + 1) if prev else 0
    npz_name = f"memory-{gen}.npz"
    digest = _atomic_write(d / npz_name, lambda f: np.savez(f, **state))
    manifest = json.loads(meta_json.tobytes().decode("utf-8"))
    manifest.update(generation=gen, npz=npz_name, sha256=digest)
    _atomic_write(d / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode("utf-8")))
    for old in d.glob("memory-*.npz"):  # only after the new manifest is durable
      if old.name != npz_name:
        old.unlink(missing_ok=True)
    return d / MANIFEST

  @classmethod
  def load(cls, directory: str | os.PathLike) -> "MemoryStore":
    d = Path(directory)
    if not (d / MANIFEST).exists():
      raise FileNotFoundError(f"no {MANIFEST} under {d}: pass the directory MemoryStore.save wrote")
    manifest = _read_manifest(d)
    data = (d / manifest["npz"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
      raise ValueError(f"{d / manifest['npz']} does not match the checksum in {d / MANIFEST}")
    with np.load(io.BytesIO(data)) as z:
      state = {k: z[k] for k in z.files}
    meta = {k: manifest[k] for k in ("version", "dim", "max_per_slot", "slots")}
    state["meta_json"] = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
    return cls.from_state_dict(state)


def _read_manifest(d: Path) -> dict:
  try:
    return json.loads((d / MANIFEST).read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{d / MANIFEST} is not valid JSON ({e})") from e


def _atomic_write(path: Path, write) -> str:
  """write(f) into a temp file beside `path`, fsync, os.replace, fsync the dir; returns sha256."""
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    with open(tmp, "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  dir_fd = os.open(path.parent, os.O_RDONLY)
  try:
    os.fsync(dir_fd)
  finally:
    os.close(dir_fd)
  return digest
