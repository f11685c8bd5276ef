"""Metrics at the edge: one JSON line per iteration in `metrics.jsonl`, TensorBoard event files
(`tb/`), and a live progress bar. Only scalars (ints, floats, bools) go to TensorBoard; strings (the
mode) go to the JSONL file only.

The workdir is an etils.epath path, local or remote (gs://, any URI epath knows):
  local   metrics.jsonl is appended and flushed every iteration and the event file is written in
          <workdir>/tb directly, so a viewer sees the run live.
  remote  lines and events are buffered on this machine (the event file in a staging directory) and
          `sync()` copies them to the workdir: the trainer calls it before every checkpoint save
          (the checkpoint stores metrics.jsonl's records up to its step, read back from the
          workdir), `write` calls it every `sync_secs`, `close()` at the end. Object stores cannot
          append: sync reads the workdir's metrics.jsonl, adds the new lines and replaces it, so
          the workdir copy is the authoritative one (a resume rewrites it: train/checkpoint.py).
Nothing is created before the first write, so a Trainer built only to evaluate leaves no files.
Events are written by `EventFile` (tensorboardX's protos and record framing, written at once: one
Event per iteration holding all its scalars), so a copy taken after a write is complete.

Episode summaries: `episode_summary(episodes)` (training, evaluation, adaptation) and
`return_summary(returns, successes)` (result files, Reflexion's trials) are the one definition of
return_mean / return_std / success.

Resume: `drop_after(step)` (Trainer.resume, before the first write) rewrites the workdir's event
files without the events past `step`, which the killed run wrote and the resumed run writes again.
The files are rewritten rather than hidden with tensorboardX's SummaryWriter(purge_step=...):
purge_step is a marker that only TensorBoard's loader applies when it reads, so any other reader
(read_scalars, scripts, tests) would still see two points for every re-run iteration. After
drop_after, every reader sees exactly one point per iteration.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
import uuid
from typing import Any, Iterator, Optional, Sequence

import numpy as np
from etils import epath

from empo2_jax import remote

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
EVENTS_PREFIX = "events.out.tfevents."


is_remote = remote.is_remote


def _scalar(v: Any):
  if isinstance(v, (bool, np.bool_)):
    return int(v)
  if isinstance(v, (int, np.integer)):
    return int(v)
  if isinstance(v, (float, np.floating)) or (hasattr(v, "shape") and getattr(v, "shape") == ()):
    return float(v)
  return None


def _replace_bytes(path: epath.Path, data: bytes) -> None:
  """path := data, through a temporary file beside it (a reader never sees half a file)."""
  tmp = path.parent / f".{path.name}.tmp"
  tmp.write_bytes(data)
  tmp.replace(path)


def return_summary(returns: Sequence[float], successes: Sequence[bool]) -> dict:
  """return_mean, return_std (population std) and success (the rate) of some episodes; nan for
  none."""
  r = np.asarray(returns, np.float64)
  if r.size == 0:
    return dict.fromkeys(("return_mean", "return_std", "success"), float("nan"))
  return {
    "return_mean": float(r.mean()),
    "return_std": float(r.std()),
    "success": float(np.mean(np.asarray(successes, bool))),
  }


def episode_summary(episodes: Sequence) -> dict:
  """`return_summary` of finished episodes plus their count (`episodes`). An episode whose env
  worker failed (a partial score) is left out and counted in `env_failed`."""
  ok = [e for e in episodes if not e.env_failed]
  return {
    **return_summary([e.episode_return for e in ok], [e.success for e in ok]),
    "episodes": len(ok),
    "env_failed": len(episodes) - len(ok),
  }


def run_dirs(workdirs: Sequence[str]) -> list[epath.Path]:
  """The training runs named by `workdirs` (local or gs://): a directory with a metrics.jsonl is
  a run; one without stands for its subdirectories that have one (a sweep root), sorted by name.
  UserError for a directory that is neither."""
  from empo2_jax.errors import UserError

  out = []
  for w in workdirs:
    w = epath.Path(str(w).rstrip("/"))
    if (w / METRICS_FILE).exists():
      out.append(w)
      continue
    subs = sorted(d for d in w.iterdir() if (d / METRICS_FILE).exists()) if w.is_dir() else []
    if not subs:
      raise UserError(
        f"no {METRICS_FILE} here and no run directories with one",
        str(w),
        "pass run workdirs or sweep roots (--workdirs=A,B)",
      )
    out += subs
  return out


def pass_at_k(group_ids: Sequence, successes: Sequence[bool]) -> tuple[float, float, int]:
  """SPA's es_manager metric over repeated episodes of each group (docs/methods.md §7):
  (pass@1, pass@k, k): pass@1 = mean success; pass@k = mean over groups of any success in
  the group; k = the smallest group size (the reported k)."""
  groups: dict = {}
  for g, s in zip(group_ids, successes):
    groups.setdefault(g, []).append(bool(s))
  if not groups:
    return float("nan"), float("nan"), 0
  p1 = float(np.mean([s for v in groups.values() for s in v]))
  pk = float(np.mean([any(v) for v in groups.values()]))
  return p1, pk, min(len(v) for v in groups.values())


class MetricsWriter:
  def __init__(
    self,
    workdir,
    total: Optional[int] = None,
    start: int = 0,
    progress: bool = True,
    tensorboard: bool = True,
    sync_secs: Optional[float] = 300.0,
    desc: str = "train",
  ):
    self.workdir = epath.Path(workdir)
    self.path = self.workdir / METRICS_FILE
    self.remote = is_remote(workdir)
    self.sync_secs = sync_secs
    self._tensorboard = tensorboard
    self._tb: Optional[EventFile] = None  # created by the first write
    self._lines = remote.LineLog(self.path)  # local: appended at once; remote: at sync()
    self._staging: Optional[str] = None  # remote: local directory of this writer's event files
    self._uploaded = 0  # remote: bytes of the event file copied to the workdir
    self._last_sync = time.monotonic()
    self._closed = False
    self._bar = None
    if progress:
      from tqdm import tqdm

      self._bar = tqdm(total=total, initial=start, desc=desc, dynamic_ncols=True)

  # -- writing ------------------------------------------------------------------------------------
  def _tb_dir(self) -> str:
    if not self.remote:
      return os.fspath(self.workdir / TB_DIR)
    if self._staging is None:
      self._staging = tempfile.mkdtemp(prefix="empo2_tb_")
    return self._staging

  def _writer(self) -> "EventFile":
    if self._tb is None:
      self._tb = EventFile(self._tb_dir())
    return self._tb

  def write(self, step: int, metrics: dict) -> None:
    record = {"iteration": int(step), "time": time.time()}
    for k, v in metrics.items():
      s = _scalar(v)
      record[k] = s if s is not None else (v if isinstance(v, str) else str(v))
    self._lines.write(json.dumps(record, allow_nan=True) + "\n")
    if self._tensorboard:
      scalars = {
        k: v
        for k, v in record.items()
        if k not in ("iteration", "time") and isinstance(v, (int, float)) and math.isfinite(v)
      }
      self._writer().write(step, scalars, record["time"])
    if self.remote and self.sync_secs is not None:
      if time.monotonic() - self._last_sync >= self.sync_secs:
        self.sync()
    if self._bar is not None:
      show = {
        k: record[k]
        for k in (
          "mode",
          "return_mean",
          "success",
          "loss/pg_loss",
          "memory_size",
          "eval/return_mean",
        )
        if k in record
      }
      self._bar.set_postfix(
        {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in show.items()}
      )
      self._bar.update(1)

  # -- the workdir copy ---------------------------------------------------------------------------
  def sync(self) -> None:
    """Bring the workdir up to date: everything written so far is there when this returns."""
    self._last_sync = time.monotonic()
    if not self.remote:
      return
    self._lines.flush()  # metrics.jsonl := its lines + this writer's new ones
    if self._tb is not None and os.path.getsize(self._tb.path) != self._uploaded:
      with open(self._tb.path, "rb") as f:  # the whole file: objects are replaced, not appended
        data = f.read()
      dst_dir = self.workdir / TB_DIR
      dst_dir.mkdir(parents=True, exist_ok=True)
      _replace_bytes(dst_dir / os.path.basename(self._tb.path), data)
      self._uploaded = len(data)

  def drop_after(self, step: int) -> int:
    """Remove events past iteration `step` from the workdir's event files (see the module doc);
    returns how many were removed. Call it before the first write."""
    if self._tb is not None:
      raise RuntimeError("drop_after must come before the first write (its file is open)")
    return drop_events_after(self.workdir / TB_DIR, step)

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    if self._tb is not None:
      self._tb.close()
    try:
      self.sync()
    finally:
      self._tb = None
      if self._staging is not None:
        shutil.rmtree(self._staging, ignore_errors=True)
      self._lines.close()
      if self._bar is not None:
        self._bar.close()


# -- event files ----------------------------------------------------------------------------------
@functools.cache
def _tbx():
  """(Event, Summary, masked_crc32c): tensorboardX's protos and record checksum, all this module
  uses of it. tensorboardX's package __init__ imports torch where it is installed, for a type
  alias the protos do not need; a training run would carry torch (+0.2 GiB resident,
  bench/host_memory.py) without ever using it. So torch is hidden while tensorboardX loads
  (`import torch` raises ImportError there, which tensorboardX handles), unless it is loaded
  already; a later `import torch` elsewhere works as usual."""
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.record_writer import masked_crc32c
  finally:
    if hide:
      del sys.modules["torch"]
  return Event, Summary, masked_crc32c


def _frame(payload: bytes) -> bytes:
  """One TFRecord: length, masked CRC32C of the length, payload, masked CRC32C of the payload."""
  masked_crc32c = _tbx()[2]
  header = struct.pack("<Q", len(payload))
  return (
    header
    + struct.pack("<I", masked_crc32c(header))
    + payload
    + struct.pack("<I", masked_crc32c(payload))
  )


class EventFile:
  """A TensorBoard event file written synchronously: each `write` is on disk when it returns.
  (tensorboardX's SummaryWriter queues events for a thread, and its flush() does not wait for the
  queue, so a copy taken after flush() can miss the last iteration.)"""

  def __init__(self, directory: str):
    Event = _tbx()[0]
    os.makedirs(directory, exist_ok=True)
    # TensorBoard reads the files of a directory in name order: the start time, to the
    # microsecond, keeps a resumed run's file after the killed one's (tensorboardX's names have
    # whole seconds: a quick resume overwrote the file before it); pid and a random tag make the
    # name unique.
    sec, usec = divmod(time.time_ns() // 1000, 1_000_000)
    host = socket.gethostname()
    name = f"{EVENTS_PREFIX}{sec:010d}.{usec:06d}.{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    self.path = os.path.join(directory, name)
    self._f = open(self.path, "wb")
    self._put(Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _put(self, event) -> None:
    self._f.write(_frame(event.SerializeToString()))
    self._f.flush()

  def write(self, step: int, scalars: dict[str, float], wall_time: Optional[float] = None):
    Event, Summary, _ = _tbx()
    values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    wall_time = time.time() if wall_time is None else wall_time
    self._put(Event(wall_time=wall_time, step=int(step), summary=Summary(value=values)))

  def close(self) -> None:
    self._f.close()


# -- reading ---------------------------------------------------------------------------------------
def read_metrics(workdir) -> list[dict]:
  path = epath.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _event_records(data: bytes) -> Iterator[tuple[bytes, Any]]:
  """(raw record, parsed Event) for each complete record of an event file (TFRecord framing:
  length, masked CRC of the length, payload, masked CRC of the payload). Stops at a record cut
  short or failing its CRC: the end of a file whose writer was killed."""
  Event, _, masked_crc32c = _tbx()
  pos = 0
  while pos + 12 <= len(data):
    header = data[pos : pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
    end = pos + 12 + length + 4
    if header_crc != masked_crc32c(header) or end > len(data):
      return
    payload = data[pos + 12 : pos + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[end - 4 : end])
    if payload_crc != masked_crc32c(payload):
      return
    yield data[pos:end], Event.FromString(payload)
    pos = end


def event_files(tb_dir) -> list[epath.Path]:
  tb_dir = epath.Path(tb_dir)
  if not tb_dir.exists():
    return []
  return sorted(
    (p for p in tb_dir.iterdir() if p.name.startswith(EVENTS_PREFIX)), key=lambda p: p.name
  )


def read_scalars(tb_dir) -> dict[str, list[tuple[int, float]]]:
  """tag -> [(step, value)] over all event files in `tb_dir`, in file-name (= start time) order."""
  out: dict[str, list[tuple[int, float]]] = {}
  for path in event_files(tb_dir):
    for _, event in _event_records(path.read_bytes()):
      for v in event.summary.value:
        if v.HasField("simple_value"):
          out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
  return out


def drop_events_after(tb_dir, step: int) -> int:
  """Rewrite the event files in `tb_dir` without the events whose step is past `step` (and
  without a record cut short at the end); returns how many events were removed."""
  dropped = 0
  for path in event_files(tb_dir):
    data = path.read_bytes()
    kept, n, size = [], 0, 0
    for raw, event in _event_records(data):
      size += len(raw)
      if event.step > step:
        n += 1
      else:
        kept.append(raw)
    if n or size != len(data):
      _replace_bytes(path, b"".join(kept))
    dropped += n
  return dropped


__all__ = [
  "return_summary",
  "episode_summary",
  "pass_at_k",
  "run_dirs",
  "MetricsWriter",
  "read_metrics",
  "read_scalars",
  "drop_events_after",
  "event_files",
  "is_remote",
]
