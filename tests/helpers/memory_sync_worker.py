"""Subprocess body for tests/memory/test_sync_multiprocess.py: one of NPROC jax.distributed
processes.

  python tests/helpers/memory_sync_worker.py OUT.json ADDR NPROC PID

Each process makes its own memory writes, calls `gather_and_commit` (every process calls it, also
with no writes) and dumps its store as canonical JSON; the test checks all dumps are identical.
"""

import hashlib
import json
import os
import sys

if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

import jax  # noqa: E402

from empo2_jax.memory.reflect import MemoryWrite  # noqa: E402
from empo2_jax.memory.store import MemoryStore  # noqa: E402
from empo2_jax.memory.sync import allgather_bytes, gather_and_commit  # noqa: E402
from empo2_jax.parallel import mesh as pmesh  # noqa: E402

DIM = 384


class HashEncoder:
  """Cheap deterministic stand-in for MiniLM: a unit vector seeded by the text's hash."""

  def encode(self, texts):
    rows = []
    for t in texts:
      seed = int.from_bytes(hashlib.sha256(t.encode("utf-8")).digest()[:8], "little")
      v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
      rows.append(v / np.linalg.norm(v))
    return np.stack(rows)


def writes_for(pid, call):
  """Per-process writes of each call; process 1 has none in call 1."""
  if call == 0:
    if pid == 0:
      return [
        MemoryWrite(("boil water", 0), "p0 tip: heat the pot ✓", 1.0, "p0 key a"),
        MemoryWrite(("boil water", 1), "p0 tip: use the stove", 0.5, "p0 key b"),
        MemoryWrite(("melt ice", 0), "shared tip", 0.25, "p0 shared key"),
      ]
    return [
      MemoryWrite(("melt ice", 0), "p1 tip: find the ice", 2.0, "p1 key a"),
      MemoryWrite(("melt ice", 0), "shared tip", 9.0, "p1 shared key"),  # dup: p0's wins
      MemoryWrite(("grow plant", 3), "p1 tip: water it — ünïcode", -1.0, "p1 key b"),
    ]
  if pid == 0:
    return [MemoryWrite(("boil water", 0), "p0 tip: second call", 0.75, "p0 key c")]
  return []


def canonical(store):
  slots = []
  for key in store.keys():
    s = store.slot(key)
    slots.append(
      {
        "slot": list(key),
        "texts": s.texts,
        "scores": s.scores.tolist(),
        "iterations": s.iterations.tolist(),
        "uids": s.uids.tolist(),
        "embeddings": np.round(s.embeddings, 6).tolist(),
      }
    )
  state = store.state_dict()
  digest = hashlib.sha256(
    b"".join(np.ascontiguousarray(state[k]).tobytes() for k in sorted(state))
  ).hexdigest()
  return {"slots": slots, "state_dict_sha256": digest}


def main(out_path, addr, nproc, pid):
  pmesh.initialize_distributed(addr, nproc, pid)
  assert jax.process_count() == nproc and jax.local_device_count() == 4
  store, enc = MemoryStore(dim=DIM), HashEncoder()
  gathered = []
  for call, iteration in ((0, 5), (1, 6)):
    g, _ = gather_and_commit(store, enc, writes_for(pid, call), iteration)
    gathered.append({"slots": [list(s) for s in g.slots], "texts": g.texts})
  payload = b"" if pid == 0 else "p1 bytes \u2713".encode("utf-8")  # empty on process 0
  out = {
    "pid": pid,
    "processes": jax.process_count(),
    "devices": jax.device_count(),
    "gathered": gathered,
    "store": canonical(store),
    "bytes": [b.decode("utf-8") for b in allgather_bytes(payload)],
  }
  with open(out_path, "w") as f:
    json.dump(out, f, sort_keys=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
