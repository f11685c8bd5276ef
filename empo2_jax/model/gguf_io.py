"""Open a .gguf file with the `gguf` package's reader, raising CheckpointError for bad input.

`read_gguf(path, local)` checks the magic bytes itself (so that a safetensors or other file
passed as .gguf is called what it is), then runs `gguf.GGUFReader` with one addition: before
the reader builds its array views, every tensor's type and extent are checked, so that an
unknown type or a truncated file is reported with the tensor's name. Any other failure of the
reader (its IndexError, ValueError, OverflowError, ... on garbage) becomes a CheckpointError
naming the file.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
from typing import Iterator

import numpy as np

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from empo2_jax import remote
from empo2_jax.model.safetensors_io import CheckpointError

GGUF_FIX = "re-download or re-convert the .gguf file"
_MAGIC = b"GGUF"


class _CheckedReader(GGUFReader):
  """GGUFReader that validates each tensor's info before the package turns it into a view.

  Hooks `_build_tensors`, which the reader (gguf 0.19) calls once with the data section's start
  and the per-tensor info fields: (name length, name, n_dims, dims, type, offset).
  """

  def __init__(self, local: str, label: str):
    self._label = label
    super().__init__(local)

  def _bad(self, name: str, what: str) -> CheckpointError:
    return CheckpointError(f"{self._label}: GGUF tensor {name}: {what}; {GGUF_FIX}")

  def _build_tensors(self, start_offs, fields):
    size, extents = len(self.data), []
    for field in fields:
      name = bytes(field.parts[1]).decode("utf-8", "replace")
      dims = [int(d) for d in field.parts[3]]
      raw_type, offset = int(field.parts[4][0]), int(field.parts[5][0])
      try:
        qtype = GGMLQuantizationType(raw_type)
      except ValueError:
        raise self._bad(
          name,
          f"tensor type {raw_type} is not a type the installed gguf package knows "
          "(a newer llama.cpp quantization?)",
        ) from None
      if qtype not in GGML_QUANT_SIZES:
        raise self._bad(name, f"tensor type {qtype.name} has no known block size")
      block, block_bytes = GGML_QUANT_SIZES[qtype]
      if dims and dims[0] % block:
        raise self._bad(
          name, f"row length {dims[0]} is not a multiple of the {qtype.name} block {block}"
        )
      start = start_offs + offset
      extents.append((start, start + math.prod(dims) * block_bytes // block, name, qtype.name))
    for start, end, name, kind in sorted(extents):  # in file order: the first one cut is named
      if end > size:
        raise self._bad(
          name,
          f"its {kind} data (bytes {start}..{end}) runs past the end of the file "
          f"({size} bytes): the file is truncated",
        )
    super()._build_tensors(start_offs, fields)


def read_gguf(path: str, local: str) -> GGUFReader:
  """A memory-mapped reader for the local file `local` (reported as `path` in errors)."""
  size = os.path.getsize(local)
  with open(local, "rb") as f:
    head = f.read(8)
  if head[:4] != _MAGIC:
    if size == 0:
      what = "the file is empty"
    elif len(head) == 8 and _looks_like_safetensors(local, head, size):
      what = "it is a safetensors file; pass its Hugging Face checkpoint directory instead"
    else:
      what = f"it starts with {head[:4]!r}, not {_MAGIC!r}"
    raise CheckpointError(f"{path}: not a GGUF file ({what}); {GGUF_FIX}")
  try:
    return _CheckedReader(local, path)
  except CheckpointError:
    raise
  except (
    ValueError,
    IndexError,
    KeyError,
    OverflowError,
    TypeError,
    UnicodeDecodeError,
    struct.error,
    OSError,
    MemoryError,
  ) as e:
    raise CheckpointError(
      f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); {GGUF_FIX}"
    ) from e


def _looks_like_safetensors(local: str, head: bytes, size: int) -> bool:
  n = int.from_bytes(head, "little")
  if not 2 <= n <= size - 8:
    return False
  with open(local, "rb") as f:
    f.seek(8)
    return f.read(1) == b"{"


@contextlib.contextmanager
def open_gguf(path: str) -> Iterator[GGUFReader]:
  """`with open_gguf(path) as reader`: a `gguf.GGUFReader` (memory-mapped) for a local or remote
  .gguf file; a remote file is streamed to a temporary copy that is removed when the block ends
  (empo2_jax/remote.py). CheckpointError (naming the file, and the tensor where there is one) for
  a file that is not valid GGUF."""
  if not remote.is_remote(path) and not os.path.isfile(path):
    raise CheckpointError(f"{path}: no such GGUF file")
  with remote.local_file(path) as local:
    yield read_gguf(path, local)


def dequantize(tensor, path: str = "GGUF file") -> np.ndarray:
  """float32 [rows, cols] (or [n]) of one `gguf.ReaderTensor`, by the package's dequantizer."""
  from gguf.quants import dequantize as gguf_dequantize

  try:
    return np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), np.float32)
  except NotImplementedError as e:
    raise CheckpointError(
      f"{path}: GGUF tensor {tensor.name}: type {tensor.tensor_type.name} cannot be "
      f"dequantized by the installed gguf package ({e}); use a file with another quantization"
    ) from e
  except (ValueError, TypeError, KeyError, IndexError) as e:
    raise CheckpointError(
      f"{path}: GGUF tensor {tensor.name}: bad {tensor.tensor_type.name} data "
      f"({type(e).__name__}: {e}); {GGUF_FIX}"
    ) from e
