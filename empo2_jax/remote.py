"""Remote (gs://) files for the model and tokenizer loaders and writers, in one place.

    with local_dir("gs://b/Qwen2.5-7B", suffixes=WEIGHT_SUFFIXES) as d:   # streamed to a temp dir
      ...read d...                                                        # removed on exit
    with local_file("gs://b/model.gguf") as f: ...
    upload_dir("/tmp/out", "gs://b/models/x")                            # streamed, file by file

A local path passes through untouched (no copy, nothing removed). A remote one is copied in
chunks of CHUNK bytes (host memory holds one chunk, not a whole safetensors shard) into a
temporary directory that is deleted when the `with` block ends, also on an error. Paths are opened
through etils.epath: gs:// needs gcsfs (`pip install "empo2_jax[gcs]"`); without it the first
use raises cli.UserError saying so. Checkpoints (orbax), metrics and episodes go through epath
directly; tests/test_gcs.py runs all of them against a GCS emulator.
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


def check(path) -> None:
  """cli.UserError when `path` is gs:// and gcsfs is not installed."""
  if str(path).startswith("gs://") and importlib.util.find_spec("gcsfs") is None:
    from empo2_jax.cli import UserError

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
  """Copy the files of local directory `local` into `dst` (created), one streamed file at a time."""
  check(dst)
  out = epath.Path(dst)
  out.mkdir(parents=True, exist_ok=True)
  for name in sorted(os.listdir(local)):
    if os.path.isfile(os.path.join(local, name)):
      copy_file(os.path.join(local, name), out / name)


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


__all__ = [
  "is_remote",
  "check",
  "copy_file",
  "local_file",
  "local_dir",
  "upload_dir",
  "writable_dir",
]
