"""Two jax.distributed CPU processes gather their memory writes and end with identical stores.

Runs tests/helpers/memory_sync_worker.py twice (process 0 and 1, 4 CPU devices each) in
subprocesses: the
device count and the distributed start must happen before jax is used, and the main pytest
process has one device.
"""

import json

import pytest

from tests.helpers import processes


@pytest.mark.slow
def test_two_processes_end_with_identical_union_memory(tmp_path):
  addr = processes.coordinator()
  outs = [tmp_path / f"p{pid}.json" for pid in (0, 1)]
  procs = [processes.start("memory_sync_worker.py", outs[pid], addr, 2, pid) for pid in (0, 1)]
  processes.finish(procs, timeout=300)
  a, b = (json.loads(o.read_text()) for o in outs)
  assert a["processes"] == b["processes"] == 2 and a["devices"] == b["devices"] == 8

  # Both hosts see the same gathered batches, in process order (0 then 1).
  assert a["gathered"] == b["gathered"]
  assert a["gathered"][0]["texts"] == [
    "p0 tip: heat the pot ✓",
    "p0 tip: use the stove",
    "shared tip",
    "p1 tip: find the ice",
    "shared tip",
    "p1 tip: water it — ünïcode",
  ]
  assert a["gathered"][1]["texts"] == ["p0 tip: second call"]  # process 1 wrote nothing

  # The raw byte gather: payloads of different lengths (one empty), in process order
  assert a["bytes"] == b["bytes"] == ["", "p1 bytes \u2713"]

  # Identical stores (byte-identical state_dict), holding the union of the writes.
  assert a["store"] == b["store"]
  slots = {tuple(s["slot"]): s for s in a["store"]["slots"]}
  assert list(slots) == [("boil water", 0), ("boil water", 1), ("grow plant", 3), ("melt ice", 0)]
  assert slots[("boil water", 0)]["texts"] == ["p0 tip: heat the pot ✓", "p0 tip: second call"]
  assert slots[("boil water", 0)]["iterations"] == [5, 6]
  assert slots[("boil water", 1)]["texts"] == ["p0 tip: use the stove"]
  assert slots[("grow plant", 3)]["texts"] == ["p1 tip: water it — ünïcode"]
  assert slots[("grow plant", 3)]["scores"] == [-1.0]
  # the text both hosts wrote is kept once, with process 0's score (first in process order)
  assert slots[("melt ice", 0)]["texts"] == ["shared tip", "p1 tip: find the ice"]
  assert slots[("melt ice", 0)]["scores"] == [0.25, 2.0]
