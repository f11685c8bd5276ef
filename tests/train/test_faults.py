"""Faults and bad input: one run per workdir, failed checkpoint saves (disk full) and
non-finite updates stop the run with a clear message and nothing lost."""

import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import jax
import orbax.checkpoint as ocp

from empo2_jax.train import checkpoint as ckpt_lib
from empo2_jax.train import faults
from empo2_jax.train import workdir_lock as wl
from tests.train.test_checkpoint import FakeTrainer, _write_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = socket.gethostname()


def _env(**extra):
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **extra)


def _holder(workdir):
  """A process that takes the workdir's lock, says so, and sleeps."""
  code = (
    "import sys, time\n"
    "from empo2_jax.train.workdir_lock import WorkdirLock\n"
    f"WorkdirLock({str(workdir)!r}).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_env(), cwd=ROOT
  )
  assert proc.stdout.readline().strip() == "locked"
  return proc


def _train_cmd(workdir, *extra):
  return [
    sys.executable,
    os.path.join(ROOT, "launch", "train.py"),
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py") + ":tiny",
    f"--workdir={workdir}",
    "--no_progress",
    *extra,
  ]


# -- one run per workdir ---------------------------------------------------------------------------
def test_second_train_on_a_locked_workdir_fails_at_once(tmp_path):
  holder = _holder(tmp_path)
  try:
    t0 = time.time()
    out = subprocess.run(
      _train_cmd(tmp_path), capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300
    )
    took = time.time() - t0
    assert out.returncode != 0, out.stdout + out.stderr
    assert f"pid {holder.pid} on host {HOST}" in out.stderr, out.stderr
    assert "in use by another run" in out.stderr and str(tmp_path / ".lock") in out.stderr
    assert "Traceback" not in out.stderr
    # Nothing was built or written: no checkpoints, no metrics (a model build + JVM take longer).
    assert sorted(os.listdir(tmp_path)) == [".lock"]
    assert took < 120, took
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid  # still theirs
  finally:
    holder.kill()
    holder.wait()
  # The holder died without releasing (SIGKILL): the next run takes the stale lock over.
  code = (
    "import logging\n"
    "from empo2_jax.train.workdir_lock import WorkdirLock\n"
    "logging.basicConfig()\n"
    f"with WorkdirLock({str(tmp_path)!r}) as lock:\n"
    "  print('took', lock.path.read_text())\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
  )
  assert out.returncode == 0, out.stderr
  assert "taking over the stale lock" in out.stderr and f"pid {holder.pid}" in out.stderr
  assert f"process {holder.pid} no longer exists" in out.stderr
  assert not (tmp_path / ".lock").exists()  # released on exit
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".lock")]


def test_lock_content_busy_and_release(tmp_path, caplog):
  lock = wl.WorkdirLock(tmp_path / "run").acquire()  # makes the workdir
  info = json.loads((tmp_path / "run" / ".lock").read_text())
  assert (info["pid"], info["host"]) == (os.getpid(), HOST) and info["started"]
  with pytest.raises(wl.WorkdirBusy, match=f"pid {os.getpid()} on host {HOST}"):
    wl.WorkdirLock(tmp_path / "run").acquire()
  lock.release()
  assert not (tmp_path / "run" / ".lock").exists()
  with pytest.raises(ZeroDivisionError):  # released on an exception too
    with wl.WorkdirLock(tmp_path / "run"):
      1 / 0
  assert not (tmp_path / "run" / ".lock").exists()


def _fake_lock(path, **kw):
  info = dict(pid=os.getpid(), host=HOST, started="then", started_unix=time.time(), token="t")
  info.update(heartbeat_unix=time.time(), command="python x.py")
  info.update(kw)
  (path / ".lock").write_text(json.dumps(info))


def _dead_pid():
  p = subprocess.Popen([sys.executable, "-c", "pass"])
  p.wait()
  return p.pid


@pytest.mark.parametrize(
  "kw, reason",
  [
    (dict(pid=None), "no longer exists"),  # None: a dead pid
    (dict(pid_start="1"), "now belongs to another process"),
    (dict(boot_id="another-boot"), "rebooted"),
    (dict(host="elsewhere", heartbeat_unix=time.time() - 3600), "heartbeat is"),
  ],
)
def test_stale_locks_are_taken_over(tmp_path, caplog, kw, reason):
  if kw.get("pid", 0) is None:
    kw["pid"] = _dead_pid()
  _fake_lock(tmp_path, **kw)
  with caplog.at_level(logging.WARNING, logger="empo2_jax"):
    lock = wl.WorkdirLock(tmp_path, heartbeat_s=0).acquire()
  assert "taking over the stale lock" in caplog.text and reason in caplog.text, caplog.text
  assert json.loads((tmp_path / ".lock").read_text())["token"] == lock._info["token"]
  lock.release()
  assert os.listdir(tmp_path) == []


def test_live_locks_are_not_taken_over(tmp_path):
  _fake_lock(tmp_path)  # this very process
  with pytest.raises(wl.WorkdirBusy, match="command: python x.py"):
    wl.WorkdirLock(tmp_path).acquire()
  _fake_lock(tmp_path, host="elsewhere", pid=1)  # another host with a fresh heartbeat
  with pytest.raises(wl.WorkdirBusy, match="pid 1 on host elsewhere"):
    wl.WorkdirLock(tmp_path).acquire()
  assert json.loads((tmp_path / ".lock").read_text())["token"] == "t"


def test_object_store_protocol_and_heartbeat(tmp_path):
  """The gs:// variant (write when absent, read back), run on a local directory."""
  lock = wl.WorkdirLock(tmp_path, local=False, settle_s=0.0, heartbeat_s=0.05).acquire()
  # Read through the lock's own reader: this variant rewrites the file in place (an object store
  # replaces objects whole; a local file is truncated first), and a raw read can see it empty.
  first = lock._read()["heartbeat_unix"]
  with pytest.raises(wl.WorkdirBusy, match=f"pid {os.getpid()}"):
    wl.WorkdirLock(tmp_path, local=False, settle_s=0.0).acquire()
  deadline = time.time() + 10
  while lock._read()["heartbeat_unix"] == first:
    assert time.time() < deadline, "no heartbeat"
    time.sleep(0.05)
  lock.release()
  assert not (tmp_path / ".lock").exists() and not lock.lost


# -- failed checkpoint saves ---------------------------------------------------------------------
def _enospc(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")


def _check_message(err, tmp_path, step=2, previous=1):
  msg = str(err)
  assert f"iteration {step}" in msg and "No space left on device" in msg, msg
  assert "(the disk is full)" in msg
  where = tmp_path / "checkpoints" / str(previous)
  assert f"previous checkpoint {where} (iteration {previous}) is intact" in msg, msg
  assert "rerunning the same command resumes from it" in msg


def _settle(directory, quiet_polls=3):
  """Wait until nothing under `directory` changes: a failed async save's other items may still be
  writing (a real run exits at once; this test reopens the directory in the same process)."""
  seen, quiet = None, 0
  while quiet < quiet_polls:
    try:
      now = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*"))
    except FileNotFoundError:  # removed while listed: still changing
      now = None
    quiet = quiet + 1 if now == seen else 0
    seen = now
    time.sleep(0.2)


def _resumes_from(tmp_path, step):
  _settle(tmp_path / "checkpoints")
  t = FakeTrainer(tmp_path, seed=9)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=1)
  assert ckpt_lib.restore_trainer(ckpt, t) == step and t.iteration == step
  t.iteration = step + 1  # and the rerun saves the next step
  ckpt_lib.save_trainer(ckpt, t, wait=True)
  assert ckpt.steps() == [step + 1]
  ckpt.close()


def test_save_failing_at_once_keeps_previous(tmp_path, monkeypatch):
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=1)
  t = FakeTrainer(tmp_path, seed=3)
  t.iteration = 1
  _write_metrics(tmp_path, 1)
  ckpt_lib.save_trainer(ckpt, t, wait=True)
  monkeypatch.setattr(ocp.CheckpointManager, "save", _enospc)
  t.iteration = 2
  with pytest.raises(ckpt_lib.CheckpointSaveError) as err:
    ckpt_lib.save_trainer(ckpt, t)
  _check_message(err.value, tmp_path)
  assert isinstance(err.value.__cause__, OSError) and err.value.previous == 1
  ckpt.close()  # nothing left to raise
  monkeypatch.undo()
  _resumes_from(tmp_path, 1)


@pytest.mark.parametrize("surfaces", ["wait", "next_save", "close"])
def test_async_save_failing_keeps_previous(tmp_path, monkeypatch, surfaces):
  """The writes fail in orbax's background thread; keep=1 would delete step 1 on success."""
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=1)
  t = FakeTrainer(tmp_path, seed=3)
  t.iteration = 1
  ckpt_lib.save_trainer(ckpt, t, wait=True)

  async def failing_json_write(self, x, directory):
    del self, x, directory
    _enospc()

  monkeypatch.setattr(ocp.handlers.JsonCheckpointHandler, "_save_fn", failing_json_write)
  t.iteration = 2
  ckpt_lib.save_trainer(ckpt, t)  # the blocking part succeeds
  with pytest.raises(ckpt_lib.CheckpointSaveError) as err:
    if surfaces == "wait":
      ckpt.wait()
    elif surfaces == "next_save":
      t.iteration = 3
      ckpt_lib.save_trainer(ckpt, t)  # stops before starting step 3
    else:
      ckpt.close()
  _check_message(err.value, tmp_path)
  ckpt.close()
  monkeypatch.undo()
  assert not (tmp_path / "checkpoints" / "2").exists()
  assert not (tmp_path / "checkpoints" / "3").exists()
  _resumes_from(tmp_path, 1)


def test_failed_first_save_says_rerun_starts_from_scratch(tmp_path, monkeypatch):
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
  monkeypatch.setattr(ocp.CheckpointManager, "save", _enospc)
  t = FakeTrainer(tmp_path, seed=1)
  t.iteration = 1
  with pytest.raises(ckpt_lib.CheckpointSaveError, match="no earlier checkpoint.*from scratch"):
    ckpt_lib.save_trainer(ckpt, t)
  ckpt.close()


# -- non-finite updates ----------------------------------------------------------------------------
def test_nonfinite_error_message_and_debug_files(tmp_path):
  t = FakeTrainer(tmp_path, seed=2)
  t.checkpointer = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
  t.iteration = 4
  ckpt_lib.save_trainer(t.checkpointer, t)  # in flight when the error is built
  batch = {"cur_tokens": np.arange(6, dtype=np.int32).reshape(2, 3), "adv": np.ones(2, np.float32)}
  bad = {"loss/pg_loss": float("nan"), "loss/grad_norm": float("inf")}
  info = {"update": dict(bad, optim_steps=1.0), "variations": [3, 1]}
  err = faults.nonfinite_error(t, 6, "on_tips", bad, info, batch, lead=True)
  msg = str(err)
  assert "iteration 6 (mode=on_tips)" in msg and "loss/pg_loss=nan" in msg, msg
  assert "loss/grad_norm=inf" in msg
  assert f"newest checkpoint is {tmp_path / 'checkpoints' / '4'} (iteration 4)" in msg, msg
  where = tmp_path / "debug" / "iter_6"
  assert str(where) in msg and err.debug_dir == where
  assert (err.iteration, err.mode, err.metrics) == (6, "on_tips", sorted(bad))
  with np.load(where / "batch.npz") as z:
    assert sorted(z.files) == sorted(batch)
    np.testing.assert_array_equal(z["cur_tokens"], batch["cur_tokens"])
  saved = json.loads((where / "info.json").read_text())
  assert saved["iteration"] == 6 and saved["mode"] == "on_tips" and saved["checkpoint"] == 4
  assert saved["nonfinite"] == sorted(bad) and saved["variations"] == [3, 1]
  assert json.loads((where / "config.json").read_text())["env"]["task"] == t.config.env.task
  t.checkpointer.close()


def test_write_error_names_the_checkpoint(tmp_path):
  t = FakeTrainer(tmp_path, seed=2)
  t.checkpointer = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
  err = faults.write_error(t, "the metrics", OSError(errno.ENOSPC, "No space left on device"))
  assert "writing the metrics" in str(err) and "disk is full" in str(err)
  assert "no checkpoint yet" in str(err)
  t.checkpointer.close()


# -- end to end (tiny config, real environments) ---------------------------------------------------
@pytest.mark.slow
def test_nonfinite_update_stops_with_last_good_checkpoint(tmp_path):
  import jax.numpy as jnp
  from configs import sciworld
  from empo2_jax.rl.batch import MODES
  from empo2_jax.train.trainer import NonFiniteError, Trainer

  config = sciworld.get_config("tiny")
  config.train.iterations = 3
  config.train.checkpoint_every = 1
  config.rollout.variations_per_iter = 1
  trainer = Trainer(config, str(tmp_path), progress=False)
  update, calls = trainer._update, []
  built, build = [], trainer.batch  # (batch, stats, layout) of each iteration, as the update saw it
  trainer.batch = lambda *a, **kw: built.append(build(*a, **kw)) or built[-1]

  def poisoned(state, batch, *args, **kw):  # the second update goes non-finite (state, metrics)
    state, m = update(state, batch, *args, **kw)
    calls.append(1)
    if len(calls) == 2:
      state = state._replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
      m = dict(m, pg_loss=jnp.asarray(jnp.nan))
    return state, m

  trainer._update = poisoned
  with pytest.raises(NonFiniteError) as err:
    trainer.run()
  msg = str(err.value)
  assert err.value.iteration == 2 and err.value.mode in MODES
  assert f"iteration 2 (mode={err.value.mode})" in msg and "loss/pg_loss=nan" in msg, msg
  where = tmp_path / "debug" / "iter_2"
  assert f"{where}" in msg and (where / "batch.npz").exists()
  assert f"newest checkpoint is {tmp_path / 'checkpoints' / '1'} (iteration 1)" in msg
  with np.load(where / "batch.npz") as z:
    batch = built[-1][0]
    assert sorted(z.files) == sorted(batch)
    np.testing.assert_array_equal(z["cur_tokens"], np.asarray(batch["cur_tokens"]))
  info = json.loads((where / "info.json").read_text())
  assert info["mode"] == err.value.mode and info["nonfinite"] == ["loss/pg_loss"]
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
  assert ckpt.steps() == [1]  # the poisoned iteration 2 was not saved
  _, state, _, meta = ckpt.restore_latest(None)
  assert meta["iteration"] == 1
  floats = [np.asarray(x) for x in jax.tree.leaves(state) if np.issubdtype(x.dtype, np.floating)]
  assert floats and all(np.isfinite(x).all() for x in floats)
  ckpt.close()
  records = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["iteration"] for r in records] == [1]


_FAIL_STEP_2 = """
import errno, runpy, sys
import orbax.checkpoint as ocp
save_fn = ocp.handlers.JsonCheckpointHandler._save_fn
async def failing(self, x, directory):
  if "/2.orbax-checkpoint-tmp" in str(directory):
    raise OSError(errno.ENOSPC, "No space left on device", str(directory))
  return await save_fn(self, x, directory)
ocp.handlers.JsonCheckpointHandler._save_fn = failing
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_disk_full_during_save_stops_and_rerun_resumes(tmp_path):
  workdir = tmp_path / "run"
  extra = [
    "--config.train.iterations=3",
    "--config.train.checkpoint_every=1",
    "--config.train.keep_checkpoints=1",
    "--config.rollout.variations_per_iter=1",
  ]
  env = _env(
    JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
  )
  cmd = _train_cmd(workdir, *extra)
  out = subprocess.run(
    [sys.executable, "-c", _FAIL_STEP_2, *cmd[1:]],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=900,
  )
  assert out.returncode == 1, out.stdout + out.stderr[-3000:]
  err = out.stderr.splitlines()[-1]
  assert err.startswith("error: saving the checkpoint of iteration 2"), out.stderr[-3000:]
  assert "No space left on device" in err and "(the disk is full)" in err
  assert f"previous checkpoint {workdir / 'checkpoints' / '1'} (iteration 1) is intact" in err
  assert not (workdir / ".lock").exists()  # released on the error
  assert ckpt_lib.Checkpointer(workdir / "checkpoints").steps() == [1]

  # The same command resumes from step 1; SIGTERM (preemption) in its iteration 2 checkpoints it,
  # exits 0 and releases the lock too.
  with open(tmp_path / "rerun.log", "w") as log_file:
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.time() + 900
    while "resumed from" not in (tmp_path / "rerun.log").read_text():
      assert proc.poll() is None and time.time() < deadline, (tmp_path / "rerun.log").read_text()
      time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=900) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
  log_text = (tmp_path / "rerun.log").read_text()
  assert f"resumed from {workdir / 'checkpoints' / '1'} at iteration 1" in log_text
  assert "preempted (SIGTERM): checkpoint at iteration 2" in log_text, log_text[-3000:]
  records = [json.loads(ln) for ln in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["iteration"] for r in records] == [1, 2]
  assert ckpt_lib.Checkpointer(workdir / "checkpoints").steps() == [2]
  assert not (workdir / ".lock").exists()
