"""safetensors files <-> numpy arrays through the `safetensors` package, with clear errors.

`iter_safetensors(path)` opens a file with `safe_open(framework="numpy")`, which checks the whole
header up front (its length, its JSON, every dtype, and that the tensors' data offsets match
their shapes and tile the data section exactly), then reads one tensor at a time in file order.
bf16 tensors come back as `ml_dtypes.bfloat16` arrays: the package asks numpy for the dtype
named "bfloat16", which importing ml_dtypes registers. `write_safetensors(path, tensors)` writes
with `safetensors.numpy.save_file` under a temporary name, then renames.

Every fault raises `CheckpointError` naming the file and saying what to do. The package's own
header messages do not name the tensor at fault, so a rejected header is re-read here, with
bounds checks, to find it.
"""

from __future__ import annotations

import json
import math
import os
from typing import Iterator

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16", which the package asks for)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

FIX = "re-download or re-export the checkpoint"
# Every dtype string the format defines -> bytes per element (None: packed sub-byte types)
_ITEMSIZE = {
  "BOOL": 1,
  "U8": 1,
  "I8": 1,
  "F8_E5M2": 1,
  "F8_E4M3": 1,
  "F8_E8M0": 1,
  "F8_E4M3FNUZ": 1,
  "F8_E5M2FNUZ": 1,
  "I16": 2,
  "U16": 2,
  "F16": 2,
  "BF16": 2,
  "I32": 4,
  "U32": 4,
  "F32": 4,
  "C64": 8,
  "F64": 8,
  "I64": 8,
  "U64": 8,
  "F4": None,
  "F6_E2M3": None,
  "F6_E3M2": None,
}
# numpy dtype -> safetensors dtype, for what the package writes and reads back as numpy arrays
_NUMPY = {
  "bool": "BOOL",
  "int8": "I8",
  "uint8": "U8",
  "int16": "I16",
  "uint16": "U16",
  "int32": "I32",
  "uint32": "U32",
  "int64": "I64",
  "uint64": "U64",
  "float16": "F16",
  "bfloat16": "BF16",
  "float32": "F32",
  "float64": "F64",
  "complex64": "C64",
}
_MAX_HEADER = 100_000_000  # the package's own limit on the JSON header


class CheckpointError(ValueError):
  """A checkpoint (safetensors, GGUF, config) that cannot be read; the message names the file,
  the tensor where there is one, and what to do. (Re-exported by empo2_jax.model.hf.)"""


def header_problem(path: str) -> str:
  """What is wrong with the header of `path`, naming the tensor at fault where there is one;
  '' when these checks find nothing (the package's message then stands alone)."""
  size = os.path.getsize(path)
  if size < 8:
    return f"the file has {size} bytes, fewer than the 8-byte header length (empty or truncated)"
  with open(path, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    if n > min(size - 8, _MAX_HEADER):
      return (
        f"its header length field says {n} bytes, but {size - 8} bytes follow "
        "(truncated, or not a safetensors file)"
      )
    raw = f.read(n)
  try:
    header = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    return f"its header is not valid JSON ({e}); not a safetensors file, or corrupt"
  if not isinstance(header, dict):
    return f"its header is a JSON {type(header).__name__}, not an object"
  data = size - 8 - n
  spans = []
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if not isinstance(info, dict):
      return f"tensor {name}: its header entry is not an object"
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _ITEMSIZE:
      return f"tensor {name}: unknown dtype {dtype!r} (known: {sorted(_ITEMSIZE)})"
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
      return f"tensor {name}: bad shape {shape!r}"
    if (
      not isinstance(offsets, list)
      or len(offsets) != 2
      or not all(isinstance(o, int) for o in offsets)
      or not 0 <= offsets[0] <= offsets[1]
    ):
      return f"tensor {name}: bad data_offsets {offsets!r}"
    itemsize = _ITEMSIZE[dtype]
    if itemsize is not None and math.prod(shape) * itemsize != offsets[1] - offsets[0]:
      return (
        f"tensor {name}: shape {shape} of {dtype} needs {math.prod(shape) * itemsize} bytes, "
        f"but data_offsets {offsets} hold {offsets[1] - offsets[0]}"
      )
    spans.append((offsets[0], offsets[1], name))
  end = 0
  for start, stop, name in sorted(spans):  # in file order: the first tensor cut off is named
    if stop > data:
      return (
        f"tensor {name}: data_offsets [{start}, {stop}] end past the {data} bytes of tensor "
        "data in the file (truncated?)"
      )
    if start != end:
      return f"tensor {name}: data_offsets start at {start}, where {end} was expected"
    end = stop
  if end != data:
    return f"the tensors' data ends at byte {end}, but the file holds {data} bytes of data"
  return ""


def _open(path: str):
  try:
    return safe_open(path, framework="numpy")
  except (SafetensorError, OSError, ValueError, OverflowError) as e:
    try:
      problem = header_problem(path)
    except OSError:
      problem = ""
    detail = f"{problem} [{e}]" if problem else str(e)
    raise CheckpointError(f"{path}: not a valid safetensors file: {detail}; {FIX}") from e


def iter_safetensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
  """Yield (name, array) for every tensor of one file, one tensor read at a time."""
  with _open(path) as f:
    for name in f.offset_keys():
      try:
        arr = f.get_tensor(name)
      except (SafetensorError, AttributeError, TypeError, ValueError, OSError) as e:
        dtype = f.get_slice(name).get_dtype()
        raise CheckpointError(
          f"{path}: tensor {name}: cannot read its {dtype} data ({type(e).__name__}: {e}); "
          f"supported: {sorted(_NUMPY.values())}; re-export the checkpoint in one of them"
        ) from e
      yield name, arr


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
  """Write `tensors` (any array-likes; kept in order) to `path` atomically."""
  arrays = {}
  for name, value in tensors.items():
    arr = np.asarray(value)
    if arr.dtype.name not in _NUMPY:
      raise CheckpointError(
        f"{path}: tensor {name}: numpy dtype {arr.dtype} cannot be stored in safetensors; "
        f"cast it to one of {sorted(_NUMPY)}"
      )
    # the package reads raw memory from the array's data pointer: it must be C-contiguous
    arrays[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")
  tmp = f"{path}.tmp"
  try:
    save_file(arrays, tmp, metadata={"format": "pt"})
  except (SafetensorError, ValueError, TypeError) as e:
    raise CheckpointError(f"{path}: cannot write safetensors ({e})") from e
  os.replace(tmp, path)
