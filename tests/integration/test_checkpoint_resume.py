"""A run killed (SIGKILL) in iteration 3 and preempted (SIGTERM) in the resumed iteration 3, rerun
with the same command each time, equals an uninterrupted run: metrics, memory, params, episodes.

Four launch/train.py processes (one uninterrupted, three for the interrupted run), tiny config with
one row per iteration; a shared persistent compilation cache keeps the later starts short.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers.numerics import assert_sums_close

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ITERATIONS = 4
VOCAB = 151_936  # the tiny preset's (Qwen2's) vocabulary: each log-prob is a log-sum over it


def _command(workdir):
  return [
    sys.executable,
    os.path.join(ROOT, "launch", "train.py"),
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py") + ":tiny",
    f"--workdir={workdir}",
    f"--config.train.iterations={ITERATIONS}",
    "--config.rollout.variations_per_iter=1",
    "--config.train.checkpoint_every=2",
    "--config.train.keep_checkpoints=5",
    "--config.train.save_episodes=True",
    "--no_progress",
  ]


def _start(workdir, cache, log):
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_COMPILATION_CACHE_DIR=str(cache),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
  )
  f = open(log, "a")
  return subprocess.Popen(
    _command(workdir), stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT
  ), f


def _wait_for(pred, proc, what, timeout=900):
  t0 = time.time()
  while not pred():
    if proc.poll() is not None:
      raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
    if time.time() - t0 > timeout:
      proc.kill()
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.2)


def _lines(path):
  return [ln for ln in open(path).read().splitlines() if ln.strip()] if os.path.exists(path) else []


def _records(workdir):
  return {
    r["iteration"]: r for r in map(json.loads, _lines(os.path.join(workdir, "metrics.jsonl")))
  }


def _final(workdir):
  from empo2_jax.train import checkpoint as ckpt_lib
  import orbax.checkpoint as ocp

  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  try:
    step = max(ckpt.steps())
    out = ckpt.manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(),
        memory=ocp.args.StandardRestore(),
        meta=ocp.args.JsonRestore(),
      ),
    )
  finally:
    ckpt.close()
  return step, out["state"], ckpt_lib.memory_from_blob(out["memory"]["npz"]), out["meta"]


def _episodes(workdir):
  from empo2_jax.data import trajectories as traj

  source = traj.load(os.path.join(workdir, "episodes", "tfds", "empo2_episodes", "1.0.0"))
  return {r["episode_id"]: r for r in (traj.decode(source[i]) for i in range(len(source)))}


@pytest.mark.slow
def test_killed_and_preempted_run_equals_uninterrupted(tmp_path):
  import jax

  cache, a_dir, b_dir = tmp_path / "jax_cache", tmp_path / "a", tmp_path / "b"
  b_log = tmp_path / "b.log"
  proc_a, fa = _start(a_dir, cache, tmp_path / "a.log")  # uninterrupted, alongside

  # 1) SIGKILL during iteration 3 (after the step-2 checkpoint is complete)
  proc, f = _start(b_dir, cache, b_log)
  _wait_for(
    lambda: (
      (b_dir / "checkpoints" / "2" / "commit_success.txt").exists()
      and len(_lines(b_dir / "metrics.jsonl")) == 2
    ),
    proc,
    "iteration 2's checkpoint",
  )
  time.sleep(1.0)
  assert proc.poll() is None
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  f.close()
  assert proc.returncode == -signal.SIGKILL

  # 2) the same command resumes from step 2; SIGTERM during its iteration 3
  proc, f = _start(b_dir, cache, b_log)
  _wait_for(lambda: "resumed from" in open(b_log).read(), proc, "the resume")
  assert f"{os.path.join(b_dir, 'checkpoints', '2')} at iteration 2" in open(b_log).read()
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=900) == 0
  f.close()
  assert "preempted (SIGTERM): checkpoint at iteration 3" in open(b_log).read()
  assert (b_dir / "checkpoints" / "3").exists()  # not a multiple of checkpoint_every
  assert sorted(_records(b_dir)) == [1, 2, 3]

  # 3) and again: resumes from step 3, runs iteration 4
  proc, f = _start(b_dir, cache, b_log)
  assert proc.wait(timeout=900) == 0, open(b_log).read()[-3000:]
  f.close()
  assert proc_a.wait(timeout=900) == 0, open(tmp_path / "a.log").read()[-3000:]
  fa.close()

  # metrics: every iteration once, equal except wall times and host-process figures (resident
  # memory, XLA compiles: a resumed process compiles again)
  ra, rb = _records(a_dir), _records(b_dir)
  assert sorted(ra) == sorted(rb) == list(range(1, ITERATIONS + 1))
  assert len(_lines(b_dir / "metrics.jsonl")) == ITERATIONS
  process = ("time/", "host/")
  for it in ra:
    ka = {k for k in ra[it] if not k.startswith(process)}
    assert ka == {k for k in rb[it] if not k.startswith(process)}
    for k in ka:
      va, vb = ra[it][k], rb[it][k]
      if isinstance(va, float):
        assert vb == pytest.approx(va, rel=1e-6, abs=1e-6), (it, k)
      else:
        assert va == vb, (it, k)
  assert {ra[it]["mode"] for it in ra} - {"on"}, "no memory iteration: a weak test"

  # params, optimizer state, RNG, cursor and memory after the last iteration
  sa, state_a, mem_a, meta_a = _final(a_dir)
  sb, state_b, mem_b, meta_b = _final(b_dir)
  assert sa == sb == ITERATIONS
  assert meta_a["variation_cursor"] == meta_b["variation_cursor"] == ITERATIONS
  la, lb = jax.tree_util.tree_flatten_with_path(state_a)[0], jax.tree.leaves(state_b)
  assert len(la) == len(lb)
  for (path, x), y in zip(la, lb):
    np.testing.assert_allclose(
      np.asarray(y), np.asarray(x), rtol=1e-6, atol=1e-6, err_msg=jax.tree_util.keystr(path)
    )
  da, db = mem_a.state_dict(), mem_b.state_dict()
  assert len(mem_a) == len(mem_b) > 0
  for k in ("meta_json", "text_bytes", "text_offsets", "iterations"):
    np.testing.assert_array_equal(da[k], db[k], err_msg=k)
  np.testing.assert_allclose(db["embeddings"], da["embeddings"], atol=1e-6)
  np.testing.assert_allclose(db["scores"], da["scores"], atol=1e-6)

  # episodes: same observations (ScienceWorld in a fresh JVM), actions, tips and sampled tokens
  ea, eb = _episodes(a_dir), _episodes(b_dir)
  assert sorted(ea) == sorted(eb) and len(ea) == ITERATIONS * 2
  for k in ea:
    la_, lb_ = ea[k].pop("sampler_logprobs"), eb[k].pop("sampler_logprobs")
    # one process's sampler against another's: the same program, but XLA's CPU reductions may
    # split differently; log-probs (~ -12) are log-sums over the vocabulary
    assert_sums_close(lb_, la_, n_terms=VOCAB, err_msg=k)
    assert ea[k] == eb[k], k
