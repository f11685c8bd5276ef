"""The GCS acceptance test: a training run whose model and workdir are both on gs://.

Against the fake-gcs-server of tests/core/test_gcs.py: a tiny random-init HF model (+ tokenizer) is
uploaded to gs://<bucket>/models/m; launch/train.py (tiny config, real ScienceWorld, 1 row x 2
rollouts, 2 steps an episode, 3 iterations, a checkpoint every iteration, episodes saved,
iteration 2 profiled) runs into gs://<bucket>/runs/x, is killed with SIGKILL once its first
checkpoint is on gs://, and is rerun with the same command; an uninterrupted run of the same
command goes to gs://<bucket>/runs/y alongside. Then:
  - x's metrics.jsonl equals y's (the resume rule of tests/integration/test_checkpoint_resume.py:
  all keys
    but wall-clock and host-process figures), and its TensorBoard events hold one point per
    iteration, equal to y's;
  - metrics.jsonl, the event files, the checkpoints (with their memory item), the episodes
    (staging + TFDS) and the profile are objects in the bucket, the lock is released;
  - launch/eval.py and launch/plot.py run on the gs:// workdirs (exit 0, outputs in the bucket);
  - nothing was written to the processes' working directory (no local `gs:` or `runs/` tree).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.core import test_gcs

gcsfs = test_gcs.gcsfs
gcs = test_gcs.gcs  # the emulator fixture (module scope: one server for this file)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ITERATIONS = 3
# Keys that differ between a resumed run and an uninterrupted one by nature: the record's wall
# clock, wall times, and host-process figures (resident memory; a resumed process compiles again).
PROCESS_KEYS = ("time/", "host/")


def _model(bucket: str) -> str:
  """The tiny preset, random init, as an HF directory with the bundled tokenizer on gs://."""
  import jax
  import numpy as np

  from empo2_jax import remote
  from empo2_jax.model import configs, hf, llama
  from empo2_jax.model.tokenizer import bundled_tokenizer_dir

  cfg = configs.get_preset("tiny", param_dtype="float32")
  params = jax.tree.map(np.asarray, llama.init_params(cfg, jax.random.PRNGKey(0)))
  path = f"{bucket}/models/m"
  hf.save_checkpoint(path, cfg, params)
  remote.upload_dir(bundled_tokenizer_dir(), path)
  return path


def _config_args(model: str) -> list[str]:
  return [
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py") + ":tiny",
    f"--config.model.checkpoint={model}",
    "--config.model.random_init=False",
    f"--config.train.iterations={ITERATIONS}",
    "--config.rollout.variations_per_iter=1",
    "--config.train.checkpoint_every=1",
    "--config.train.save_episodes=True",
    "--config.train.profile_iteration=2",
  ]


def _env(tmp_path) -> dict:
  cache, tmp = tmp_path / "jax_cache", tmp_path / "tmp"
  tmp.mkdir(exist_ok=True)
  return dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_COMPILATION_CACHE_DIR=str(cache),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    TMPDIR=str(tmp),
  )


def _start(args, cwd, env, log):
  f = open(log, "a")
  proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
  return proc, f


def _finish(proc, f, log, timeout=900) -> None:
  try:
    rc = proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    rc = "timeout"
  f.close()
  assert rc == 0, f"{log}: exit {rc}\n" + _tail(log)


def _tail(log, n=4000) -> str:
  lines = [ln for ln in open(log).read().splitlines() if "Could not determine bucket" not in ln]
  return "\n".join(lines)[-n:]


def _fs():
  fs = gcsfs.core.GCSFileSystem(token="anon")  # the class the fixture gives gs://
  fs.invalidate_cache()
  return fs


def _objects(prefix: str) -> list[str]:
  """Every object under gs://`prefix`, relative to it."""
  bare = prefix.removeprefix("gs://").rstrip("/")
  return sorted(p[len(bare) + 1 :] for p in _fs().find(bare))


def _records(workdir: str) -> dict:
  text = _fs().cat(workdir.removeprefix("gs://") + "/metrics.jsonl").decode("utf-8")
  recs = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
  assert len({r["iteration"] for r in recs}) == len(recs), "an iteration written twice"
  return {r["iteration"]: r for r in recs}


def _same_metrics(ra: dict, rb: dict) -> None:
  assert sorted(ra) == sorted(rb) == list(range(1, ITERATIONS + 1))
  for it in ra:
    keys = {k for k in ra[it] if k != "time" and not k.startswith(PROCESS_KEYS)}
    assert keys == {k for k in rb[it] if k != "time" and not k.startswith(PROCESS_KEYS)}
    for k in keys:
      va, vb = ra[it][k], rb[it][k]
      if isinstance(va, float):
        assert vb == pytest.approx(va, rel=1e-6, abs=1e-6, nan_ok=True), (it, k)
      else:
        assert va == vb, (it, k)


@pytest.mark.slow  # ~8.5 min on 2 busy cores: three training processes, an evaluation, plots
def test_train_kill_resume_eval_plot_on_gcs(gcs, tmp_path):
  from empo2_jax.train import metrics as metrics_lib

  model = _model(gcs)
  x, y = f"{gcs}/runs/x", f"{gcs}/runs/y"
  cwd = tmp_path / "cwd"  # every process runs here: nothing may appear in it
  cwd.mkdir()
  env = _env(tmp_path)
  train = [sys.executable, os.path.join(ROOT, "launch", "train.py"), "--no_progress"]
  x_cmd = train + [f"--workdir={x}"] + _config_args(model)
  y_cmd = train + [f"--workdir={y}"] + _config_args(model)
  x_log, y_log = tmp_path / "x.log", tmp_path / "y.log"

  proc_y, fy = _start(y_cmd, cwd, env, y_log)  # uninterrupted, alongside
  # 1) SIGKILL once x's first checkpoint is committed on gs:// (orbax's commit marker)
  proc, f = _start(x_cmd, cwd, env, x_log)
  marker = x.removeprefix("gs://") + "/checkpoints/1/commit_success.txt"
  deadline = time.time() + 900
  while not _fs().exists(marker):
    assert proc.poll() is None, f"x exited ({proc.returncode}) before its checkpoint\n" + _tail(
      x_log
    )
    assert time.time() < deadline, "timed out waiting for x's first checkpoint"
    time.sleep(0.5)
  assert proc.poll() is None, "x finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  f.close()
  assert proc.returncode == -signal.SIGKILL

  # 2) the same command resumes from the newest checkpoint on gs:// (taking over the stale lock)
  proc, f = _start(x_cmd, cwd, env, x_log)
  _finish(proc, f, x_log)
  log = open(x_log).read()
  resumed = [ln for ln in log.splitlines() if ln.startswith("resumed from ")]
  assert len(resumed) == 1 and resumed[0].startswith(f"resumed from {x}/checkpoints/"), log[-3000:]
  assert int(resumed[0].split(" at iteration ")[1]) < ITERATIONS
  _finish(proc_y, fy, y_log)

  # 3) metrics: x (killed, resumed) == y (uninterrupted); TensorBoard: one point per iteration
  _same_metrics(_records(y), _records(x))
  tb_x, tb_y = metrics_lib.read_scalars(f"{x}/tb"), metrics_lib.read_scalars(f"{y}/tb")
  assert [s for s, _ in tb_x["return_mean"]] == list(range(1, ITERATIONS + 1))
  for tag in ("return_mean", "memory_size", "loss/pg_loss", "train_tokens"):
    (sx, vx), (sy, vy) = zip(*tb_x[tag]), zip(*tb_y[tag])
    assert sx == sy and vx == pytest.approx(vy, rel=1e-6, abs=1e-6), tag

  # 4) everything of the run is in the bucket
  for run in (x, y):
    names = _objects(run)
    assert "metrics.jsonl" in names
    assert any(n.startswith("tb/events.out.tfevents.") for n in names), names
    for step in range(1, ITERATIONS + 1):  # keep_checkpoints=3: all three steps
      for item in ("state", "memory", "meta"):
        assert f"checkpoints/{step}/{item}/commit_success.txt" in names, (run, step, item)
    staged = [n for n in names if n.startswith("episodes/staging/iter-")]
    assert staged == [f"episodes/staging/iter-{i:08d}.jsonl" for i in (1, 2, 3)], staged
    assert any(n.startswith("episodes/tfds/empo2_episodes/") for n in names), names
    assert any(n.startswith("profile/") and n.endswith(".xplane.pb") for n in names), names
    assert ".lock" not in names

  # 5) evaluation and plots read (and write) the gs:// workdirs
  ev_log, plot_log = tmp_path / "eval.log", tmp_path / "plot.log"
  ev = [sys.executable, os.path.join(ROOT, "launch", "eval.py"), f"--workdir={x}"]
  _finish(*_start(ev + _config_args(model), cwd, env, ev_log), ev_log)
  assert "eval/result.json" in _objects(x)
  plot = [sys.executable, os.path.join(ROOT, "launch", "plot.py"), f"--workdirs={x},{y}"]
  _finish(*_start(plot + [f"--out={gcs}/plots"], cwd, env, plot_log), plot_log)
  assert "returns.png" in _objects(f"{gcs}/plots")

  # 6) nothing local: no directory named like the workdir, here or in the repository
  assert os.listdir(cwd) == [], os.listdir(cwd)
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
