"""bench/_common.trace_breakdown (bench/update.py --profile): exclusive time per XLA op kind from a
Perfetto trace, on a hand-written trace with nesting, two threads and non-XLA frames; and
hlo_dot_flops/matmul_split: matmul flops per op of a compiled program, against the shapes'
own count, and over a real traced call (loop bodies counted once per iteration)."""

import gzip
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# bench/_common.py by its path (the benches import it as a script-local module)
_spec = importlib.util.spec_from_file_location(
  "bench_common", os.path.join(ROOT, "bench", "_common.py")
)
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
op_kind, trace_breakdown = _common.op_kind, _common.trace_breakdown
hlo_dot_flops, matmul_split = _common.hlo_dot_flops, _common.matmul_split


def event(name, ts, dur, tid=1, hlo=True):
  args = {"hlo_op": name} if hlo else {}
  return {"ph": "X", "name": name.split(".")[0], "ts": ts, "dur": dur, "pid": 7, "tid": tid,
          "args": args}  # fmt: skip


def test_exclusive_time_by_op_kind(tmp_path):
  events = [
    event("$api.py:10 call", 0, 500, hlo=False),  # a Python frame: not an XLA op
    event("while.3", 0, 100),  # its body: fusion.1 and dot.2
    event("fusion.1", 10, 30),
    event("dot.2", 50, 40),
    event("fusion.7", 120, 20),  # after the loop, same thread
    event("fusion.9", 0, 30, tid=2),  # another worker thread
    {"ph": "M", "pid": 7, "tid": 2, "name": "thread_name", "args": {"name": "worker"}},
  ]
  d = tmp_path / "plugins" / "profile" / "run1"
  d.mkdir(parents=True)
  with gzip.open(d / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  rows = {k: (round(s * 1e6), n) for k, s, n in trace_breakdown(str(tmp_path), top=10)}
  assert rows == {"fusion": (80, 3), "dot": (40, 1), "while": (30, 1)}
  assert [k for k, _, _ in trace_breakdown(str(tmp_path), top=2)] == ["fusion", "dot"]


def test_a_reused_directory_reads_its_newest_trace(tmp_path):
  for run, (op, ts) in enumerate([("dot.1", 1_000), ("fusion.2", 2_000)]):
    d = tmp_path / "plugins" / "profile" / f"run{run}"
    d.mkdir(parents=True)
    path = d / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as f:
      json.dump({"traceEvents": [event(op, 0, 10)]}, f)
    os.utime(path, (ts, ts))
  assert [k for k, _, _ in trace_breakdown(str(tmp_path))] == ["fusion"]
  with pytest.raises(FileNotFoundError, match="no perfetto_trace"):
    trace_breakdown(str(tmp_path / "empty"))


def test_op_kind():
  assert op_kind("copy_bitcast_fusion.12") == "copy_bitcast_fusion"
  assert op_kind("dot") == "dot"
  assert op_kind("cond.3.clone") == "cond.3.clone"  # not a numbered suffix: kept whole


def _program():
  """A jitted gradient with a plain dot, a scanned dot (3 iterations) and a batched einsum, and
  its matmul flops: (per listed op once, per call with the loop's iterations)."""
  import jax
  import jax.numpy as jnp

  def f(a, b, w):
    h = jax.nn.silu(a @ b)  # [8, 16] @ [16, 8]
    x, _ = jax.lax.scan(lambda x, wi: (jnp.tanh(x @ wi), None), h, w)  # 3 x [8, 8] @ [8, 8]
    return jnp.einsum("bij,bjk->bik", x.reshape(2, 4, 8), x.reshape(2, 8, 4)).sum()

  args = (jnp.ones((8, 16)), jnp.ones((16, 8)), jnp.ones((3, 8, 8)))
  compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2))).lower(*args).compile()
  ab, step, bmm = 2 * 8 * 16 * 8, 2 * 8 * 8 * 8, 2 * (2 * 4 * 8 * 4)
  # forward, then two products per forward product in the backward (the input's and the weight's)
  static = 3 * (ab + step + bmm)
  per_call = 3 * (ab + 3 * step + bmm)
  return compiled, args, static, per_call


def test_hlo_dot_flops_counts_each_product():
  compiled, _, static, _ = _program()
  flops = hlo_dot_flops(compiled.as_text())
  assert sum(flops.values()) == static
  assert all(f > 0 for f in flops.values())


def test_matmul_split_of_a_traced_call(tmp_path):
  import jax

  compiled, args, _, per_call = _program()
  jax.block_until_ready(compiled(*args))
  with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
    jax.block_until_ready(compiled(*args))
  split = matmul_split(str(tmp_path), compiled.as_text())
  assert split["matmul_gflop"] * 1e9 == per_call  # the loop body's ops once per iteration
  assert split["matmul_s"] > 0 and split["other_s"] > 0
  assert split["matmul_gflops_per_s"] == split["matmul_gflop"] / split["matmul_s"]
