"""bench/_common.trace_breakdown (bench/update.py --profile): exclusive time per XLA op kind from a
Perfetto trace, on a hand-written trace with nesting, two threads and non-XLA frames."""

import gzip
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# bench/_common.py by its path (the benches import it as a script-local module)
_spec = importlib.util.spec_from_file_location(
  "bench_common", os.path.join(ROOT, "bench", "_common.py")
)
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
op_kind, trace_breakdown = _common.op_kind, _common.trace_breakdown


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


def test_op_kind():
  assert op_kind("copy_bitcast_fusion.12") == "copy_bitcast_fusion"
  assert op_kind("dot") == "dot"
  assert op_kind("cond.3.clone") == "cond.3.clone"  # not a numbered suffix: kept whole
