"""Pod preemption: SIGTERM to ONE of two jax.distributed processes; both checkpoint after the same
iteration and exit 0 (train/trainer.py OR-s the per-host flag across hosts every iteration)."""

import json
import signal
import time

from tests.helpers import processes


def _done(path) -> int:
  return len(path.read_text().split()) if path.exists() else 0


def test_sigterm_to_one_host_stops_both_after_the_same_iteration(tmp_path):
  addr = processes.coordinator()
  procs = [processes.start("preempt_worker.py", tmp_path, addr, 2, pid) for pid in (0, 1)]
  try:
    deadline = time.time() + 240
    while min(_done(tmp_path / f"progress-{p}") for p in (0, 1)) < 3:
      assert time.time() < deadline and all(p.poll() is None for p in procs), [
        p.communicate()[0][-3000:] for p in procs if p.poll() is not None
      ]
      time.sleep(0.1)
  except BaseException:
    for p in procs:
      p.kill()
    raise
  procs[1].send_signal(signal.SIGTERM)  # the slower host only
  logs = processes.finish(procs, timeout=120)
  results = [json.loads((tmp_path / f"result-{pid}.json").read_text()) for pid in (0, 1)]
  saved = [(tmp_path / f"saved-{pid}").read_text().split() for pid in (0, 1)]
  assert results[0]["iteration"] == results[1]["iteration"] >= 3, results
  assert results[0]["preempted"] and results[1]["preempted"]
  assert saved[0] == saved[1] == [str(results[0]["iteration"])]  # one checkpoint, same iteration
  assert "SIGTERM on another host" in logs[0]
