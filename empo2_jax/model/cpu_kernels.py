"""The sampler's CPU kernels (cpu_kernels.cc, cpu_attention.cc): built on first use, called
through the XLA FFI.

On the CPU backend a sampler decode step is a pass over memory: a product of a few rows (one token
per sampled row) with every weight matrix, and attention over the filled part of each row's KV
cache. XLA:CPU runs few-row products well below the machine's bandwidth and copies each
dynamically sliced cache block before reading it; the kernels read weights and cache in place,
once, on XLA's intra-op threads. A prefill chunk's attention over the cache runs here too
(`prefill_attention`), its score tiles kept in L1 rather than written out per block.
`LlamaConfig.decode_kernels` chooses them ("auto": on the CPU backend for float32 when they build;
"xla": never; "cpu": always, an error if they cannot build).

Build: the first call compiles the two sources into one library with the C++ compiler (`CXX`,
default g++; x86-64 with AVX2 and FMA, `-march=native`) against jax's FFI headers into a cache
folder (`EMPO2_KERNEL_CACHE`, default ~/.cache/empo2_jax/kernels), keyed by the sources, the
header, the flags, the compiler (its path and file), the jax version and the host CPU (its model
and feature flags: a cache shared between hosts of different CPUs never loads a library built
for another instruction set), so later processes on the same kind of host load it without
compiling. When the build fails, `available()` is False, `build_error()` says why, the failure is
remembered under the same key (a `.failed` file beside the libraries: later processes do not
compile again) and reported once per process, in one line; "auto" then keeps XLA's path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).parent
SOURCES = (HERE / "cpu_kernels.cc", HERE / "cpu_attention.cc")  # built into one library
HEADERS = (HERE / "cpu_kernels.h",)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
TARGETS = {  # FFI target name -> exported handler symbol
  "empo2_rows_matmul_nt": "Empo2RowsMatmulNT",
  "empo2_cached_attention": "Empo2CachedAttention",
  "empo2_prefill_attention": "Empo2PrefillAttention",
}
PREFILL_HEAD_DIMS = (64, 128)  # the head sizes prefill_attention has a kernel for
# /proc/cpuinfo fields that name the CPU an -march=native build targets (x86, then Arm); the
# feature lists among them are sets (sorted), the others names (words kept in order)
CPU_FIELDS = ("vendor_id", "model name", "flags", "CPU implementer", "CPU part", "Features")
FEATURE_FIELDS = ("flags", "Features")
_ERROR: list[str] = []
log = logging.getLogger("empo2_jax")


class BuildFailed(RuntimeError):
  """The compiler could not build the library (remembered for its key)."""


def cache_dir() -> Path:
  """Where built libraries are kept (EMPO2_KERNEL_CACHE, default ~/.cache/empo2_jax/kernels)."""
  env = os.environ.get("EMPO2_KERNEL_CACHE")
  return Path(env) if env else Path.home() / ".cache" / "empo2_jax" / "kernels"


def host_cpu() -> str:
  """What an -march=native build depends on: the machine, and the CPU's model and feature flags
  (the first processor's /proc/cpuinfo fields; the processor name where there is no such file)."""
  lines = [platform.machine()]
  try:
    info = Path("/proc/cpuinfo").read_text(errors="replace")
  except OSError:
    return "\n".join(lines + [platform.processor()])
  for field in CPU_FIELDS:
    for line in info.splitlines():
      name, _, value = line.partition(":")
      if name.strip() == field:
        words = value.split()
        lines.append(f"{field}: {' '.join(sorted(words) if field in FEATURE_FIELDS else words)}")
        break
  return "\n".join(lines)


def _compiler(cxx: str) -> str:
  """The compiler `cxx` as found on PATH, with its file's size and time (a new compiler is a new
  key); "missing" when there is none."""
  found = shutil.which(cxx)
  if found is None:
    return f"{cxx}: missing"
  st = os.stat(os.path.realpath(found))
  return f"{os.path.realpath(found)} {st.st_size} {st.st_mtime_ns}"


def _library_path(cxx: str) -> Path:
  key = hashlib.sha256()
  for path in SOURCES + HEADERS:
    key.update(path.read_bytes())
  parts = (" ".join((cxx,) + FLAGS), _compiler(cxx), jax.__version__, host_cpu())
  for part in parts:
    key.update(part.encode() + b"\0")
  return cache_dir() / f"cpu_kernels-{key.hexdigest()[:16]}.so"


def _write_atomic(path: Path, text: str) -> None:
  fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=path.parent)
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _build(cxx: str) -> Path:
  """The library's path, compiling it first if the cache lacks it (written to a temporary name
  and renamed, so processes building at once never load a half-written file). BuildFailed when
  the compiler fails, or failed before for the same key (its `.failed` file)."""
  path = _library_path(cxx)
  if path.exists():
    return path
  failed = path.with_suffix(".failed")
  if failed.exists():
    raise BuildFailed(f"{failed.read_text().strip()} (remembered in {failed}: delete it to retry)")
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
  try:
    try:
      done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
      why = f"no C++ compiler {cxx!r}"
    else:
      errors = [ln.strip() for ln in done.stderr.splitlines() if "error" in ln]
      detail = " | ".join(errors or [done.stderr.strip()])[:500]
      why = f"{cxx} exited with status {done.returncode}" + (f": {detail}" if detail else "")
      if done.returncode == 0:
        os.replace(tmp, path)
        return path
      if done.returncode < 0:  # killed (out of memory, a signal): not the compiler's verdict
        raise BuildFailed(why)
    _write_atomic(failed, why)
    raise BuildFailed(why)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


@lru_cache(maxsize=None)
def available() -> bool:
  """True once the library is built, loaded and its targets registered with XLA (CPU platform);
  False if that failed (build_error() says why; logged once, as one line). Tried once per
  process."""
  try:
    lib = ctypes.cdll.LoadLibrary(str(_build(os.environ.get("CXX", "g++"))))
    for name, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
    _ERROR[:] = [" ".join(f"{type(e).__name__}: {e}".split())]  # one line
    log.warning(
      "the CPU decode kernels are unavailable, the sampler runs XLA's path: %s. To use them, "
      "install g++ (x86-64 with AVX2 and FMA; a new compiler is tried again); to skip them, set "
      "model.decode_kernels=xla",
      _ERROR[0],
    )
    return False
  return True


def build_error() -> Optional[str]:
  """Why `available()` is False (None when it is True or was not tried)."""
  return _ERROR[0] if _ERROR else None


def use_kernels(mode: str, dtype, backend: Optional[str] = None) -> bool:
  """Whether a decode step runs these kernels under `mode` (one of configs.DECODE_KERNELS, which
  LlamaConfig validates) for values of `dtype` on `backend` (default jax's default). ValueError:
  "cpu" where the kernels cannot run; RuntimeError: "cpu" and the kernels did not build."""
  if mode == "xla":
    return False
  backend = backend or jax.default_backend()
  fits = backend == "cpu" and jnp.dtype(dtype) == jnp.float32
  if mode == "auto":
    return fits and available()
  if not fits:
    raise ValueError(
      f"decode_kernels='cpu' runs float32 on the CPU backend; this is {jnp.dtype(dtype).name} on "
      f"{backend}: use decode_kernels='auto' or 'xla'"
    )
  if not available():
    raise RuntimeError(
      f"decode_kernels='cpu': the CPU kernels did not build ({build_error()}); install g++ "
      "(x86-64 with AVX2 and FMA) or set model.decode_kernels=auto or xla"
    )
  return True


def _require():
  if not available():
    raise RuntimeError(f"the CPU decode kernels did not build: {build_error()}")


def rows_matmul(x: jax.Array, w_t: jax.Array) -> jax.Array:
  """x [..., K] @ w_t[N, K]^T -> [..., N] float32, in one pass over w_t: for a few rows (a decode
  step's tokens). CPU platform only."""
  _require()
  k, n = x.shape[-1], w_t.shape[0]
  x2 = x.reshape(-1, k).astype(jnp.float32)
  out = jax.ffi.ffi_call(
    "empo2_rows_matmul_nt", jax.ShapeDtypeStruct((x2.shape[0], n), jnp.float32)
  )(x2, w_t.astype(jnp.float32))
  return out.reshape(x.shape[:-1] + (n,))


def products(x: jax.Array, ws, w_t: jax.Array) -> list[jax.Array]:
  """[x @ w for w in ws] (x [..., K], each w [K, N_i]) as float32: on the CPU platform one
  `rows_matmul` over w_t, the ws joined along N and transposed ([sum N_i, K]), split after;
  elsewhere by XLA over the ws (the choice is made when the program is lowered for its platform)."""
  ws = list(ws)
  sizes = [w.shape[-1] for w in ws]
  if w_t.shape != (sum(sizes), x.shape[-1]):
    raise ValueError(
      f"w_t is {w_t.shape}; the ws {[w.shape for w in ws]} need {(sum(sizes), x.shape[-1])}"
    )

  def cpu(x, w_t, *ws):
    out = rows_matmul(x, w_t)
    return [out[..., a:b] for a, b in zip(np.cumsum([0] + sizes[:-1]), np.cumsum(sizes))]

  def other(x, w_t, *ws):
    return [(x @ w).astype(jnp.float32) for w in ws]

  return jax.lax.platform_dependent(x, w_t, *ws, cpu=cpu, default=other)


def cached_attention(q, k_all, v_all, layer, rows, last, mask) -> jax.Array:
  """One query per row over one layer of the cache, read in place.

  Args:
    q: [B, Kh, G, hd] float32 (G query heads per KV head).
    k_all, v_all: [L, B', Kh, S, hd] float32, the whole cache.
    layer: int scalar, the layer to read.
    rows: [B] int32, the cache row of each batch row.
    last: [B] int32, the query's slot: slots 0..last[b] with mask[b, s] > 0 are seen.
    mask: [B, S] int32.
  Returns:
    [B, Kh, G, hd] float32: softmax(q k^T / sqrt(hd)) v over the seen slots; zeros if none.
    CPU platform only.
  """
  return _attention("empo2_cached_attention", q, k_all, v_all, layer, rows, last, mask)


def prefill_attention(q, k_all, v_all, layer, rows, slots, mask) -> jax.Array:
  """Several queries per row over one layer of the cache, read in place (a prefill chunk).

  Args:
    q: [B, T, Kh, G, hd] float32, hd in PREFILL_HEAD_DIMS.
    k_all, v_all: [L, B', Kh, S, hd] float32, the whole cache.
    layer: int scalar; rows: [B] int32 cache row of each batch row.
    slots: [B, T] int32: query (b, t) sees the slots s <= slots[b, t] with mask[b, s] > 0.
    mask: [B, S] int32.
  Returns:
    [B, T, Kh, G, hd] float32: softmax(q k^T / sqrt(hd)) v over the seen slots; zeros if none.
    CPU platform only.
  """
  return _attention("empo2_prefill_attention", q, k_all, v_all, layer, rows, slots, mask)


def _attention(target, q, k_all, v_all, layer, rows, slots, mask) -> jax.Array:
  """The FFI call of an attention kernel (`target`): float32 q, the cache as is, int32 indices;
  the result is shaped like q."""
  _require()
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, jnp.float32))(
    q.astype(jnp.float32),
    k_all,
    v_all,
    jnp.asarray(layer, jnp.int32).reshape(()),
    jnp.asarray(rows, jnp.int32),
    jnp.asarray(slots, jnp.int32),
    jnp.asarray(mask, jnp.int32),
  )
