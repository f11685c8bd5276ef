"""Remote (gs://) files in one place: what cannot go through etils.epath directly.

    with local_dir("gs://b/Qwen2.5-7B", suffixes=WEIGHT_SUFFIXES) as d:   # streamed to a temp dir
      ...read d...                                                        # removed on exit
    with local_file("gs://b/model.gguf") as f: ...
    upload_dir("/tmp/out", "gs://b/models/x")                            # streamed, file by file
    with writable_dir("gs://b/runs/x/profile") as d: ...write d...        # uploaded on exit
    log = LineLog("gs://b/runs/x/sft_metrics.jsonl")                    # appends; remote at flush
    absolute(workdir)                                                    # abspath, gs:// kept

Who uses what: model/tokenizer readers (local_dir, local_file), HF writers (writable_dir), the
profiler trace (writable_dir: jax.profiler writes gs:// with its own client, not gcsfs), the
metrics and SFT logs (LineLog: objects cannot be appended to).

A local path passes through untouched (no copy, nothing removed). A remote one is copied in
chunks of CHUNK bytes (host memory holds one chunk, not a whole safetensors shard) into a
temporary directory that is deleted when the `with` block ends, also on an error. Paths are opened
through etils.epath: gs:// needs gcsfs (`pip install "empo2_jax[gcs]"`); without it the first
use raises cli.UserError saying so. Checkpoints (orbax), TensorBoard events, episodes, the workdir
lock and eval/plot outputs go through epath directly. tests/core/test_gcs.py runs these pieces
against a GCS emulator, tests/integration/test_gcs_train.py a whole training run (kill, resume,
eval, plots).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from typing import Iterator, Optional, Sequence

from etils import epath

CHUNK = 64 << 20
GCS_HINT = 'install the GCS extra: pip install "empo2_jax[gcs]" (gcsfs)'
# What a Hugging Face model directory needs here: weights, config, tokenizer, chat template.
WEIGHT_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja")
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".jinja")
TOKENIZER_SKIP = ("model.safetensors.index.json",)


def is_remote(path) -> bool:
  return "://" in os.fspath(path)


def absolute(path) -> str:
  """A local path made absolute (orbax wants absolute paths); a remote one as it is
  (os.path.abspath would turn gs://b/x into <cwd>/gs:/b/x)."""
  return os.fspath(path) if is_remote(path) else os.path.abspath(path)


def check(path) -> None:
  """cli.UserError when `path` is gs:// and gcsfs is not installed."""
  if str(path).startswith("gs://") and importlib.util.find_spec("gcsfs") is None:
    from empo2_jax.errors import UserError

    raise UserError("gs:// paths need the gcsfs package, which is not installed", path, GCS_HINT)


def copy_file(src, dst, chunk: int = CHUNK) -> None:
  """Copy one file between any two epath locations, `chunk` bytes at a time."""
  check(src)
  check(dst)
  with epath.Path(src).open("rb") as fin, epath.Path(dst).open("wb") as fout:
    shutil.copyfileobj(fin, fout, chunk)


@contextlib.contextmanager
def local_file(path) -> Iterator[str]:
  """A local path for `path`: itself, or a temporary copy of a remote file (removed after)."""
  if not is_remote(path):
    yield os.fspath(path)
    return
  with tempfile.TemporaryDirectory(prefix="empo2_remote_") as tmp:
    local = os.path.join(tmp, epath.Path(path).name)
    copy_file(path, local)
    yield local


@contextlib.contextmanager
def local_dir(
  path, suffixes: Optional[Sequence[str]] = None, skip: Sequence[str] = ()
) -> Iterator[str]:
  """A local directory for `path`: itself, or a temporary copy of a remote directory's files
  (those ending in one of `suffixes`, all when None; none named in `skip`), removed after."""
  if not is_remote(path):
    yield os.fspath(path)
    return
  check(path)
  src = epath.Path(path)
  with tempfile.TemporaryDirectory(prefix="empo2_remote_") as tmp:
    for f in src.iterdir():
      if f.name in skip or (suffixes is not None and not f.name.endswith(tuple(suffixes))):
        continue
      if not f.is_dir():
        copy_file(f, os.path.join(tmp, f.name))
    yield tmp


def upload_dir(local: str, dst) -> None:
  """Copy the files of local directory `local`, subdirectories included, into `dst` (created),
  one streamed file at a time."""
  check(dst)
  out = epath.Path(dst)
  out.mkdir(parents=True, exist_ok=True)
  for name in sorted(os.listdir(local)):
    src = os.path.join(local, name)
    if os.path.isdir(src):
      upload_dir(src, out / name)
    elif os.path.isfile(src):
      copy_file(src, out / name)


@contextlib.contextmanager
def writable_dir(path) -> Iterator[str]:
  """A local directory to write `path`'s files into: `path` itself (created), or a temporary one
  uploaded to the remote `path` when the block ends without an error, then removed."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)
    yield os.fspath(path)
    return
  check(path)
  with tempfile.TemporaryDirectory(prefix="empo2_remote_out_") as tmp:
    yield tmp
    upload_dir(tmp, path)


class LineLog:
  """Lines appended to a text file (a JSONL log), local or remote.

    log = LineLog(workdir + "/sft_metrics.jsonl")
    log.write(json.dumps(record) + "\n")
    log.flush()        # remote: before a checkpoint and at the end; local: a no-op
    log.close()        # flushes

  Local: each `write` is appended and flushed at once. Remote: an object cannot be appended to, so
  lines wait here until `flush()` reads the object, adds them and replaces it (a line cut short at
  its end, which no writer here leaves, is dropped first). Lines not flushed are lost with the
  process, as with any buffered log."""

  def __init__(self, path):
    check(path)
    self.path = epath.Path(path)
    self.remote = is_remote(path)
    self._pending: list[str] = []
    self._f = None

  def write(self, line: str) -> None:
    if self.remote:
      self._pending.append(line)
      return
    if self._f is None:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._f = open(os.fspath(self.path), "a", encoding="utf-8")
    self._f.write(line)
    self._f.flush()

  def flush(self) -> None:
    if not self._pending:
      return
    old = self.path.read_text() if self.path.exists() else ""
    old = old[: old.rfind("\n") + 1]
    self.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = self.path.parent / f".{self.path.name}.tmp"
    tmp.write_text(old + "".join(self._pending))
    tmp.replace(self.path)
    self._pending = []

  def close(self) -> None:
    try:
      self.flush()
    finally:
      if self._f is not None:
        self._f.close()
        self._f = None

  def __enter__(self) -> "LineLog":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


__all__ = [
  "absolute",
  "LineLog",
  "is_remote",
  "check",
  "copy_file",
  "local_file",
  "local_dir",
  "upload_dir",
  "writable_dir",
]
