"""Sweep expansion (launch/sweep.py, configs/sweeps.py) and the comparison plots
(launch/plot.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from configs import sweeps, sciworld
from empo2_jax import cli
from launch import plot, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = os.path.join(ROOT, "configs", "sciworld.py") + ":tiny"
SWEEPS = os.path.join(ROOT, "configs", "sweeps.py")


def test_grid_and_zip():
  runs = sweeps.product(sweeps.sweep("a", [1, 2, 3]), sweeps.sweep("b", [0.5, 1.0]))
  assert len(runs) == 6 and {(r["a"], r["b"]) for r in runs} == {
    (a, b) for a in (1, 2, 3) for b in (0.5, 1.0)
  }
  assert sweeps.zip_(sweeps.sweep("a", [1, 2]), sweeps.sweep("b", [3, 4])) == [
    {"a": 1, "b": 3},
    {"a": 2, "b": 4},
  ]
  with pytest.raises(ValueError):
    sweeps.zip_(sweeps.sweep("a", [1, 2]), sweeps.sweep("b", [3]))
  pq = sweeps.get_sweep("pq")
  assert len(pq) == 6 and {r["empo2.p_memory"] for r in pq} == {0.1, 0.25, 0.5}


def test_dry_run_expands_four_tiny_runs(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "launch", "sweep.py"),
      f"--config={CONFIG}",
      f"--sweep={SWEEPS}:tiny4",
      f"--workdir={tmp_path}",
      "--dry_run",
      "--no_progress",
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  runs = json.loads(out.stdout)
  assert len(runs) == 4 and len({r["workdir"] for r in runs}) == 4
  for r in runs:
    assert os.path.dirname(r["workdir"]) == str(tmp_path)
    assert f"--workdir={r['workdir']}" in r["command"] and "--no_progress" in r["command"]
    for k, v in r["overrides"].items():
      assert f"--config.{k}={v}" in r["command"]
  assert {
    (r["overrides"]["empo2.p_memory"], r["overrides"]["empo2.q_offpolicy"]) for r in runs
  } == {(0.0, 0.0), (0.0, 1.0), (0.5, 0.0), (0.5, 1.0)}


def test_bad_sweep_key_names_valid_keys(tmp_path):
  with pytest.raises(SystemExit, match="p_memory"):
    sweep.check_overrides(sciworld.get_config("tiny"), {"empo2.p_memry": 0.1}, "x")
  with pytest.raises(SystemExit, match="empo2.p_memory"):
    sweep.check_overrides(sciworld.get_config("tiny"), {"empo2.p_memory": "high"}, "x")


def _fake_run(workdir, seed, n=12, resumed_at=None):
  rng = np.random.default_rng(seed)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    its = list(range(1, n + 1))
    if resumed_at:  # a resumed run that repeated iterations after its checkpoint
      its = its[: resumed_at + 2] + its[resumed_at:]
    for i in its:
      rec = {
        "iteration": i,
        "mode": "on",
        "return_mean": float(10 * seed + i + rng.normal()),
        "success": float(rng.random() < 0.1 * seed),
        "loss/entropy": 3.0 - 0.1 * i,
        "time/rollout_and_reflect": 5.0 + seed,
        "time/batching": 0.5,
        "time/update": 2.0,
        "time/iteration": 8.0 + seed,
      }
      if i % 4 == 0:
        rec.update({"eval/return_mean": 10.0 * seed + i, "eval/success": 0.1, "time/eval": 1.0})
      f.write(json.dumps(rec) + "\n")


def test_plot_four_runs(tmp_path):
  root = tmp_path / "sweep"
  for s, name in enumerate(["empo2", "grpo", "p=0.5,q=0", "p=0.5,q=1"]):
    _fake_run(root / name, s, resumed_at=5 if s == 1 else None)
  out = tmp_path / "plots"
  subprocess.run(
    [sys.executable, os.path.join(ROOT, "launch", "plot.py"), f"--workdirs={root}", f"--out={out}"],
    check=True,
    timeout=120,
  )
  for name in ("returns.png", "entropy.png", "time_per_phase.png", "comparison.png"):
    path = out / name
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 15_000 < len(data) < 400_000, (name, len(data))
  import matplotlib.image

  img = matplotlib.image.imread(str(out / "comparison.png"))
  assert img.shape[0] > 500 and img.shape[1] > 800
  assert img[..., :3].std() > 0.05  # not a blank canvas
  recs = plot.read_run(str(root / "grpo"))
  assert [r["iteration"] for r in recs] == list(range(1, 13))
  with pytest.raises(cli.UserError, match="metrics.jsonl"):  # one line, exit 2 (empo2_jax/cli.py)
    plot.find_runs([str(tmp_path / "nothing")])


def test_env_steps_axis_sums_each_kept_iteration_once(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  steps = {1: 30, 2: 25, 3: 40}
  lines = [{"iteration": i, "return_mean": float(i), "env_steps": steps[i]} for i in (1, 2, 3)]
  lines.insert(2, {"iteration": 2, "return_mean": 9.0, "env_steps": 999})  # redone after resume
  lines[2], lines[1] = lines[1], lines[2]  # the first try of iteration 2 comes first
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  recs = plot.read_run(str(run))
  x, y = plot.series(recs, "return_mean", "env_steps")
  kept2 = lines[2]["env_steps"]
  np.testing.assert_array_equal(x, [30, 30 + kept2, 30 + kept2 + 40])
  np.testing.assert_array_equal(plot.series(recs, "return_mean")[0], [1, 2, 3])
  # runs from before the env_steps metric have no environment-step points
  old = tmp_path / "old"
  old.mkdir()
  (old / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "return_mean": 1.0}) + "\n")
  assert len(plot.series(plot.read_run(str(old)), "return_mean", "env_steps")[0]) == 0
  plot.main([f"--workdirs={run}", f"--out={tmp_path / 'plots'}", "--x=env_steps"])
  assert (tmp_path / "plots" / "returns.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_real_tiny2_sweep_then_plot(tmp_path):
  """launch/sweep.py really runs two tiny runs (one launch/train.py subprocess each, real
  ScienceWorld, 2 iterations), then launch/plot.py compares them. Cheap env/rollout overrides go on
  the sweep's command line, which passes them to every run."""
  root, out = tmp_path / "tiny2", tmp_path / "plots"
  cheap = [
    "--config.env.max_steps=1",
    "--config.rollout.variations_per_iter=1",
    "--config.rollout.group_size=2",
    "--config.train.checkpoint_every=0",
    "--no_progress",
  ]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)
  done = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "launch", "sweep.py"),
      f"--config={CONFIG}",
      f"--sweep={SWEEPS}:tiny2",
      f"--workdir={root}",
      *cheap,
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
  runs = json.loads((root / "sweep.json").read_text())
  assert len(runs) == 2
  names = sorted(d.name for d in root.iterdir() if d.is_dir())
  assert names == sorted(r["name"] for r in runs) and len(names) == 2
  for r in runs:
    recs = plot.read_run(r["workdir"])
    assert [x["iteration"] for x in recs] == [1, 2], r["name"]  # tiny2 sets train.iterations=2
    assert all(x["episode_steps"] == 1.0 for x in recs)  # the cheap overrides reached it
    assert all(np.isfinite(x["return_mean"]) and np.isfinite(x["loss/entropy"]) for x in recs)
    if r["overrides"]["empo2.p_memory"] == 0.0:  # no memory: GRPO, on-policy only
      assert {x["mode"] for x in recs} == {"on"}, r["name"]
  subprocess.run(
    [sys.executable, os.path.join(ROOT, "launch", "plot.py"), f"--workdirs={root}", f"--out={out}"],
    env=env,
    check=True,
    timeout=120,
  )
  data = (out / "comparison.png").read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, len(data)


def test_a_method_without_its_own_script_sweeps_with_the_standard_one():
  """launch/sweep.script_for: a training method runs launch/train.py, an evaluation-only one
  (naive, reflexion) launch/eval.py, a method with its own script (SPA) that script."""

  assert sweep.script_for("grpo").endswith("launch/train.py")
  assert sweep.script_for("naive").endswith("launch/eval.py")
  assert sweep.script_for("reflexion").endswith("launch/eval.py")
  assert sweep.script_for("spa").endswith("launch/spa.py")
