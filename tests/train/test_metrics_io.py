"""Metrics, TensorBoard events, eval tables and plots in a gs:// workdir (a fake bucket: etils'
epath.testing.mock_epath maps gs://<bucket>/... to a local directory), and a resumed run's
TensorBoard scalars: exactly one point per iteration."""

import json
import os
import shutil
import struct

import numpy as np
import pytest
from etils import epath
from tensorboardX.record_writer import masked_crc32c

from empo2_jax import cli
from empo2_jax.train import checkpoint as ckpt_lib
from empo2_jax.train import metrics as metrics_lib
from empo2_jax.train.metrics import MetricsWriter

GS = "gs://"


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """A fake GCS: epath paths under gs:// live in tmp_path/gcs. Appending to an object fails, as on
  GCS. The working directory is an empty tmp_path/cwd, so a stray local write shows."""
  root = tmp_path / "gcs"
  root.mkdir()
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)

  def local(p):
    p = os.fspath(p)
    return str(root / p[len(GS) :]) if p.startswith(GS) else p

  def one(fn, path, *args, **kwargs):
    return fn(local(path), *args, **kwargs)

  def two(fn, path, dst, *args, **kwargs):
    return fn(local(path), local(dst), *args, **kwargs)

  def open_(fn, path, mode):
    if os.fspath(path).startswith(GS) and "a" in mode:
      raise OSError(f"{path}: objects cannot be appended to")
    return fn(local(path), mode)

  def glob(fn, pattern):
    out = fn(local(pattern))
    if os.fspath(pattern).startswith(GS):
      out = [GS + os.path.relpath(p, root) for p in out]
    return out

  fns = {
    k: one for k in ("exists", "isdir", "listdir", "makedirs", "mkdir", "remove", "rmtree", "stat")
  }
  with epath.testing.mock_epath(
    open=open_, glob=glob, walk=one, rename=two, replace=two, copy=two, **fns
  ):
    yield root, cwd


def _metrics(step, resumed=False):
  return {
    "mode": "on",
    "return_mean": float(step) + (0.5 if resumed else 0.0),
    "loss/pg_loss": -0.1 * step,
    "success": step % 2 == 0,
    "memory_size": np.int64(3 * step),
  }


def _lines(path):
  return [json.loads(x) for x in open(path).read().splitlines() if x.strip()]


def test_gs_workdir_metrics_and_events_land_in_the_bucket(bucket):
  root, cwd = bucket
  workdir = "gs://bkt/runs/a"
  w = MetricsWriter(workdir, progress=False)
  for step in (1, 2, 3):
    w.write(step, _metrics(step))
  assert not (root / "bkt").exists()  # buffered until a sync (a checkpoint save) or close
  w.sync()
  assert [r["iteration"] for r in _lines(root / "bkt/runs/a/metrics.jsonl")] == [1, 2, 3]
  assert metrics_lib.read_scalars(workdir + "/tb")["return_mean"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
  w.write(4, _metrics(4))
  staging = w._staging
  w.close()
  assert staging and not os.path.exists(staging)
  recs = metrics_lib.read_metrics(workdir)
  assert [r["iteration"] for r in recs] == [1, 2, 3, 4] and recs[0]["mode"] == "on"
  assert recs[1]["success"] == 1 and recs[2]["memory_size"] == 9
  scalars = metrics_lib.read_scalars(workdir + "/tb")
  assert [s for s, _ in scalars["loss/pg_loss"]] == [1, 2, 3, 4]
  assert "mode" not in scalars  # strings go to metrics.jsonl only
  assert len(list((root / "bkt/runs/a/tb").iterdir())) == 1
  assert os.listdir(cwd) == []  # nothing written to a local "gs:" directory

  # The bucket's copy is authoritative: a resume rewrites it (train/checkpoint.py, through epath),
  # and the next writer appends to what is there, not to a copy of its own.
  assert [r["iteration"] for r in ckpt_lib.read_records(workdir, upto=2)] == [1, 2]
  ckpt_lib.rewrite_records(workdir, ckpt_lib.read_records(workdir, upto=2))
  w = MetricsWriter(workdir, start=2, progress=False)
  w.write(3, _metrics(3, resumed=True))
  w.close()
  recs = metrics_lib.read_metrics(workdir)
  assert [r["iteration"] for r in recs] == [1, 2, 3] and recs[2]["return_mean"] == 3.5
  assert os.listdir(cwd) == []


def test_a_writer_that_writes_nothing_leaves_no_files(tmp_path, bucket):
  for workdir in (str(tmp_path / "local"), "gs://bkt/empty"):
    MetricsWriter(workdir, progress=False).close()  # e.g. a Trainer built only to evaluate
    assert not epath.Path(workdir).exists()
  assert os.listdir(bucket[0]) == []


def test_remote_sync_every_sync_secs(bucket):
  root, _ = bucket
  w = MetricsWriter("gs://bkt/live", progress=False, sync_secs=0)
  w.write(1, _metrics(1))
  assert len(_lines(root / "bkt/live/metrics.jsonl")) == 1  # no checkpoint needed
  w.close()


@pytest.mark.parametrize("where", ["local", "gs"])
def test_resumed_run_has_one_tb_point_per_iteration(where, tmp_path, bucket):
  """A run checkpoints after iteration 3, writes 4 and 5, and is killed; the resumed run
  (Trainer.resume: metrics.jsonl rewritten, then drop_after(3)) writes 4..6 again."""
  workdir = str(tmp_path / "run") if where == "local" else "gs://bkt/run"
  tb = epath.Path(workdir) / "tb"
  w = MetricsWriter(workdir, progress=False)
  for step in (1, 2, 3):
    w.write(step, _metrics(step))
  w.sync()  # the checkpoint save at iteration 3
  for step in (4, 5):
    w.write(step, _metrics(step))
  w.sync()  # (remote: a timed sync; local: written as they happen)
  w._tb.close()  # killed: no close(), the writer's thread ends with the process
  if w._staging:
    shutil.rmtree(w._staging)
  files = metrics_lib.event_files(tb)
  assert len(files) == 1
  assert [s for s, _ in metrics_lib.read_scalars(tb)["return_mean"]] == [1, 2, 3, 4, 5]
  # the kill cut the file in the middle of a record (a complete header, half the payload)
  header = struct.pack("<Q", 32)
  cut = header + struct.pack("<I", masked_crc32c(header)) + b"\x08" * 10
  files[0].write_bytes(files[0].read_bytes() + cut)

  ckpt_lib.rewrite_records(workdir, ckpt_lib.read_records(workdir, upto=3))
  w = MetricsWriter(workdir, start=3, progress=False)
  assert w.drop_after(3) == 2  # the events of iterations 4 and 5
  for step in (4, 5, 6):
    w.write(step, _metrics(step, resumed=True))
  with pytest.raises(RuntimeError, match="before the first write"):
    w.drop_after(3)
  w.close()

  scalars = metrics_lib.read_scalars(tb)
  assert set(scalars) == {"return_mean", "loss/pg_loss", "success", "memory_size"}
  for tag, points in scalars.items():
    assert [s for s, _ in points] == [1, 2, 3, 4, 5, 6], tag
  assert dict(scalars["return_mean"]) == {1: 1, 2: 2, 3: 3, 4: 4.5, 5: 5.5, 6: 6.5}
  assert len(metrics_lib.event_files(tb)) == 2  # the resumed writer's file sits beside it
  assert [r["iteration"] for r in metrics_lib.read_metrics(workdir)] == [1, 2, 3, 4, 5, 6]

  # a fresh start over an unsaved attempt (Trainer.resume finds no checkpoint): drop_after(0)
  w = MetricsWriter(workdir, progress=False)
  assert w.drop_after(0) == 6
  w.close()
  assert metrics_lib.read_scalars(tb) == {}


def test_eval_tables_and_plots_in_gs(bucket):
  from launch import eval as eval_launch
  from launch import plot
  from empo2_jax.train import evaluate

  root, cwd = bucket
  for name, offset in (("empo2", 0.0), ("grpo", 1.0)):
    w = MetricsWriter(f"gs://bkt/sweep/{name}", progress=False, tensorboard=False)
    for step in range(1, 5):
      m = dict(_metrics(step), **{"loss/entropy": 3.0 - 0.1 * step, "time/update": 1.0 + offset})
      w.write(step, m)
    w.close()

  rows = evaluate.with_average([evaluate.summarize("find-animal", "no memory", [10, 30], [0, 1])])
  md = eval_launch.write_tables("gs://bkt/sweep/empo2", rows)
  assert (root / "bkt/sweep/empo2/eval/table.md").read_text() == md
  assert "find-animal" in (root / "bkt/sweep/empo2/eval/table.csv").read_text()

  runs = plot.find_runs(["gs://bkt/sweep/"])
  assert sorted(runs) == ["empo2", "grpo"] and len(runs["grpo"]) == 4
  paths = plot.make_plots(runs, "gs://bkt/plots")
  assert paths == [f"gs://bkt/plots/{n}" for n in plot_names()]
  for name in plot_names():
    assert (root / "bkt/plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(cli.UserError, match="metrics.jsonl"):  # one line, exit 2 (empo2_jax/cli.py)
    plot.find_runs(["gs://bkt/nothing"])
  assert os.listdir(cwd) == []


def plot_names():
  return ["returns.png", "entropy.png", "time_per_phase.png", "comparison.png", "exploration.png"]
