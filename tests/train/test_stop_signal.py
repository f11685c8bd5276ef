"""Preemption inside the notice window (train/run_control.py): when SIGTERM stops at a turn
boundary, when every iteration is checkpointed, and the watchdog that ends the process at the
deadline wherever it is."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import ml_collections
import pytest

from empo2_jax.train import run_control


def _config(stop_at="auto", deadline=25.0):
  return ml_collections.ConfigDict({"train": {"stop_at": stop_at, "stop_deadline_s": deadline}})


def test_long_iterations_decide_the_stop():
  c = _config()
  assert not run_control.long_iterations(c, None)  # no iteration timed yet: finish it
  assert not run_control.long_iterations(c, 24.9)
  assert run_control.long_iterations(c, 25.1)
  assert run_control.long_iterations(_config("turn"), None)
  assert not run_control.long_iterations(_config("iteration"), 3600.0)
  assert run_control.long_iterations(_config(deadline=5.0), 6.0)


def test_sigterm_stops_at_a_turn_boundary_only_when_long():
  stop = run_control.StopSignal(lambda: 4, deadline_s=60.0)
  try:
    stop.check_turn()  # nothing received: no stop
    stop.at_turns = False
    os.kill(os.getpid(), signal.SIGTERM)
    stop.check_turn()  # short iterations: the iteration finishes
    assert stop.requested() and stop._timer is None
  finally:
    stop.close()
  stop = run_control.StopSignal(lambda: 4, deadline_s=60.0)
  try:
    stop.at_turns = True
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(run_control.Preempted, match="iteration 5 at a turn boundary"):
      stop.check_turn()
    assert stop._timer is not None and stop._timer.is_alive()
  finally:
    stop.close()  # cancels the watchdog
  assert not stop._timer.is_alive()


WATCHDOG = textwrap.dedent(
  """
  import os, signal, sys, time
  from empo2_jax.train import run_control

  marker = sys.argv[1]
  stop = run_control.StopSignal(lambda: 7, deadline_s=1.0,
                                on_deadline=lambda: open(marker, "w").write("killed workers"))
  stop.at_turns = True
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(60)  # a long update step: no turn boundary comes
  print("not reached", flush=True)
  """
)


def test_the_watchdog_ends_the_process_at_the_deadline(tmp_path):
  script, marker = tmp_path / "watchdog.py", tmp_path / "marker"
  script.write_text(WATCHDOG)
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  t0 = time.monotonic()
  out = subprocess.run(
    [sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=60, env=env
  )
  took = time.monotonic() - t0
  assert out.returncode == 0, out.stderr[-2000:]
  assert "stop deadline of 1 s reached in iteration 8" in out.stdout
  assert "not reached" not in out.stdout and marker.read_text() == "killed workers"
  assert took < 30  # 1 s after the signal, plus the interpreter's start
