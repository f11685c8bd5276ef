"""Preemption at a turn boundary (train.stop_at=turn, the behaviour of long iterations): a SIGTERM
at the start of iteration 3 ends the run within train.stop_deadline_s, losing at most that
iteration, and the rerun of the same command equals an uninterrupted run (every metric but wall
times and host figures, the final params)."""

import signal
import time

import numpy as np
import pytest

from tests.integration import test_checkpoint_resume as resume

ITERATIONS = 3
DEADLINE_S = 25.0
_RESUME_COMMAND = resume._command  # python, launch/train.py, the tiny config, --workdir


def _command(workdir):
  return [
    *_RESUME_COMMAND(workdir)[:4],
    f"--config.train.iterations={ITERATIONS}",
    "--config.rollout.variations_per_iter=1",
    "--config.train.checkpoint_every=0",  # stop_at=turn checkpoints every iteration itself
    "--config.train.keep_checkpoints=5",
    "--config.train.stop_at=turn",
    f"--config.train.stop_deadline_s={DEADLINE_S}",
    "--no_progress",
  ]


@pytest.mark.slow
def test_a_stop_at_a_turn_boundary_resumes_exactly(tmp_path, monkeypatch):
  import jax

  monkeypatch.setattr(resume, "_command", _command)
  cache, a_dir, b_dir, b_log = (
    tmp_path / "cache",
    tmp_path / "a",
    tmp_path / "b",
    tmp_path / "b.log",
  )
  proc_a, fa = resume._start(a_dir, cache, tmp_path / "a.log")  # uninterrupted, alongside
  proc, f = resume._start(b_dir, cache, b_log)
  resume._wait_for(
    lambda: (
      (b_dir / "checkpoints" / "2" / "commit_success.txt").exists()
      and len(resume._lines(b_dir / "metrics.jsonl")) == 2
    ),
    proc,
    "iteration 2's checkpoint",
  )
  t0 = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == 0
  took = time.monotonic() - t0
  f.close()
  log = open(b_log).read()
  assert took < DEADLINE_S + 5, (took, log[-2000:])
  assert "preempted (SIGTERM)" in log
  done = sorted(resume._records(b_dir))
  # at a turn boundary: iteration 3 dropped; in its update: finished and checkpointed
  assert done == [1, 2] if "at a turn boundary" in log else done == [1, 2, 3], log[-2000:]

  proc, f = resume._start(b_dir, cache, b_log)
  assert proc.wait(timeout=900) == 0, open(b_log).read()[-3000:]
  f.close()
  assert proc_a.wait(timeout=900) == 0, open(tmp_path / "a.log").read()[-3000:]
  fa.close()

  ra, rb = resume._records(a_dir), resume._records(b_dir)
  assert sorted(ra) == sorted(rb) == list(range(1, ITERATIONS + 1))
  for it in ra:
    keys = {k for k in ra[it] if not k.startswith(("time/", "host/"))}
    assert keys == {k for k in rb[it] if not k.startswith(("time/", "host/"))}
    for k in keys:
      if isinstance(ra[it][k], float):
        assert rb[it][k] == pytest.approx(ra[it][k], rel=1e-6, abs=1e-6), (it, k)
      else:
        assert ra[it][k] == rb[it][k], (it, k)
  sa, state_a, _, _ = resume._final(a_dir)
  sb, state_b, _, _ = resume._final(b_dir)
  assert sa == sb == ITERATIONS
  for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-6, atol=1e-6)
