"""gs:// for the launch scripts other than train.py, and for reading episodes back.

Against the fake-gcs-server of tests/core/test_gcs.py (its `gcs` fixture: one server for this
module):
  - data/trajectories.load reads a dataset written to gs:// back equal to the same dataset written
    locally, through a temporary local copy that is gone once the source is; the readers built on
    it (data/episodes_html.read_records, baselines/retrospex_data.read_records) read gs:// runs;
  - launch/sweep.py writes sweep.json and gives every run a workdir under a gs:// root;
  - launch/retrospex.py train reads episodes from gs:// and writes the critic there
    (baselines/retrospex_iql.save/load round-trip through orbax's GCS driver);
  - launch/spa.py runs its three stages in a gs:// workdir (slow);
and nothing is written into the processes' working directory.
"""

import gc
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from etils import epath

from tests.core import test_gcs

gcsfs = test_gcs.gcsfs
gcs = test_gcs.gcs  # the emulator fixture (module scope)


@pytest.fixture
def tmpdir_watch(tmp_path, monkeypatch):
  """tempfile's directory for the test (TFDS's dataset builds leave their own temporary
  directories there; what trajectories.load copies is checked by name, _copies)."""
  root = tmp_path / "tmp"
  root.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(root))
  return root


def _copies(root) -> list[str]:
  return [n for n in os.listdir(root) if n.startswith("empo2_tfds_read_")]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from tests.integration.test_gcs_train import _objects  # noqa: E402  (one copy of the helpers)


def _env(tmp_path) -> dict:
  tmp = tmp_path / "proc_tmp"
  tmp.mkdir(exist_ok=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu", TMPDIR=str(tmp))
  env.pop("XLA_FLAGS", None)
  return env


def _episodes(seed=0):
  """{iteration: [actor.Episode]} of tests/data/test_trajectories.py's generator."""
  from tests.data.test_trajectories import _episode

  rng = np.random.default_rng(seed)
  return {it: [_episode(rng, i, n_turns=1 + (i + it) % 3) for i in range(4)] for it in (1, 2)}


def _write_run(episodes_dir, episodes) -> epath.Path:
  from empo2_jax.data import trajectories as traj

  log = traj.EpisodeLog(episodes_dir)
  for it, eps in episodes.items():
    log.write(it, eps)
  return log.build_dataset()


def _read_all(source) -> dict:
  from empo2_jax.data import trajectories as traj

  recs = [traj.decode(source[i]) for i in range(len(source))]
  return {r["episode_id"]: r for r in recs}


def test_trajectories_written_to_gcs_load_back_equal_to_local(gcs, tmp_path, tmpdir_watch):
  from empo2_jax.baselines import retrospex_data
  from empo2_jax.data import episodes_html
  from empo2_jax.data import trajectories as traj

  episodes = _episodes()
  want = {
    r["episode_id"]: json.loads(json.dumps(r))
    for it, eps in episodes.items()
    for r in (traj.episode_record(e, it) for e in eps)
  }
  local = _write_run(tmp_path / "run" / "episodes", episodes)
  remote_run = f"{gcs}/traj/run"
  path = _write_run(f"{remote_run}/episodes", episodes)
  assert str(path) == f"{remote_run}/episodes/tfds/empo2_episodes/1.0.0"
  names = _objects(str(path))
  assert "dataset_info.json" in names and any(".array_record-" in n for n in names), names

  source = traj.load(path)
  assert len(_copies(tmpdir_watch)) == 1, "gs:// is read through a local temporary copy"
  got = _read_all(source)
  assert got == _read_all(traj.load(local)) == want
  del source
  gc.collect()
  assert _copies(tmpdir_watch) == [], "the copy goes with the source"

  # The readers built on load(): retrospex's from the run's workdir, the HTML page's from the
  # TFDS dataset once the staging files are gone.
  by_id = {r["episode_id"]: r for r in retrospex_data.read_records([remote_run])}
  assert by_id == want
  for p in epath.Path(f"{remote_run}/episodes/staging").glob("iter-*.jsonl"):
    p.unlink()
  html_recs = episodes_html.read_records(remote_run)
  assert {r["episode_id"]: r for r in html_recs} == want
  gc.collect()
  assert _copies(tmpdir_watch) == []


def test_loading_a_missing_gcs_dataset_names_what_to_pass(gcs, tmpdir_watch):
  from empo2_jax.data import trajectories as traj

  with pytest.raises(FileNotFoundError, match=r"no episode dataset at gs://.*/nothing/1\.0\.0"):
    traj.load(f"{gcs}/nothing/1.0.0")


def test_sweep_writes_sweep_json_and_run_workdirs_under_a_gcs_root(gcs, tmp_path, monkeypatch):
  """launch/sweep.py in-process, launching nothing (subprocess.run records the commands)."""
  from launch import sweep

  started = []

  def fake_run(cmd, check=False):
    started.append(cmd)
    return subprocess.CompletedProcess(cmd, 0)

  monkeypatch.setattr(sweep.subprocess, "run", fake_run)
  monkeypatch.chdir(tmp_path)
  root = f"{gcs}/sweeps/tiny2"
  config = os.path.join(ROOT, "configs", "sciworld.py") + ":tiny"
  sweeps = os.path.join(ROOT, "configs", "sweeps.py")
  argv = [f"--config={config}", f"--sweep={sweeps}:tiny2", f"--workdir={root}/", "--no_progress"]
  assert sweep.main(argv) == 0
  runs = json.loads(epath.Path(f"{root}/sweep.json").read_text())
  assert len(runs) == len(started) == 2
  for r, cmd in zip(runs, started):
    assert r["workdir"] == f"{root}/{r['name']}"  # the trailing "/" of --workdir dropped
    assert cmd == r["command"] and f"--workdir={r['workdir']}" in cmd and "--no_progress" in cmd
  assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # nothing local


def test_gcs_without_credentials_is_one_line_before_anything_starts(tmp_path):
  """No emulator, no credentials: each script stops at once naming what to set (not gcsfs's
  anonymous fallback, whose requests fail after minutes of retries)."""
  env = _env(tmp_path)
  env.pop("STORAGE_EMULATOR_HOST", None)
  env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "no-such-key.json")
  config = os.path.join(ROOT, "configs", "frozenlake.py") + ":tiny"
  sweeps = os.path.join(ROOT, "configs", "sweeps.py")
  workdir = "gs://empo2-no-credentials/x"
  scripts = {
    "sweep.py": [f"--config={config}", f"--sweep={sweeps}:tiny2", f"--workdir={workdir}"],
    "spa.py": [f"--config={config}", f"--workdir={workdir}"],
    "retrospex.py": ["train", f"--config={config}", "--workdir=runs/r", f"--episodes={workdir}"],
  }
  for script, args in scripts.items():
    cmd = [sys.executable, os.path.join(ROOT, "launch", script), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, (script, out.stderr[-3000:])
    flag = "--episodes" if script == "retrospex.py" else "--workdir"
    want = f"error: {flag} is on gs:// but no Google Cloud credentials were found: File "
    assert lines[0].startswith(want) and "no-such-key.json was not found" in lines[0], lines
    assert f"({workdir}): run `gcloud auth application-default login`" in lines[0], lines
    assert "GOOGLE_APPLICATION_CREDENTIALS" in lines[0], lines
  assert sorted(os.listdir(tmp_path)) == ["proc_tmp"]  # nothing made (retrospex: no runs/r)


def _retrospex(args, tmp_path, cwd):
  cmd = [sys.executable, os.path.join(ROOT, "launch", "retrospex.py"), *args]
  return subprocess.run(
    cmd, capture_output=True, text=True, env=_env(tmp_path), cwd=cwd, timeout=600
  )


@pytest.mark.slow  # ~2 min on 2 busy cores: a JAX process compiling the GRU critics, then a load
def test_retrospex_trains_from_gcs_episodes_into_a_gcs_workdir(gcs, tmp_path):
  from empo2_jax.baselines import retrospex_data as D
  from empo2_jax.baselines import retrospex_iql as Q

  run, workdir = f"{gcs}/retrospex/run", f"{gcs}/retrospex/critic"
  _write_run(f"{run}/episodes", _episodes(seed=1))
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  config = os.path.join(ROOT, "configs", "sciworld.py") + ":tiny"
  out = _retrospex(
    ["train", f"--config={config}", f"--workdir={workdir}", f"--episodes={run}", "--steps=3",
     "--passes=1", "--batch=4", "--vocab=200"],
    tmp_path,
    cwd,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"critic saved in {workdir}" in out.stdout
  names = _objects(workdir)
  assert {"critic.json", "tokenizer.model", "retrospex_train.json"} <= set(names), names
  assert any(n.startswith("critic/") for n in names), names
  summary = json.loads(epath.Path(f"{workdir}/retrospex_train.json").read_text())
  assert summary["episodes"] == [run] and summary["episode_count"] == 8

  # The critic loads back from gs:// and scores the transitions of the same episodes.
  nets, state, cfg, tok, meta = Q.load(workdir)
  assert int(state.step) == 3 and cfg.batch_size == 4 and meta["transitions"] > 0
  trans = D.transitions(D.read_records([run]))
  assert len(trans) == meta["transitions"]
  adv = Q.advantages(nets, state, D.encode_transitions(trans, tok))
  assert adv.shape == (len(trans),) and np.all(np.isfinite(adv))
  assert os.listdir(cwd) == [], os.listdir(cwd)

  bad = _retrospex(["eval", f"--config={config}", f"--workdir={gcs}/retrospex/none"], tmp_path, cwd)
  assert bad.returncode == 2, bad.stderr[-3000:]
  assert "no Retrospex critic in gs://" in bad.stderr and "launch/retrospex.py train" in bad.stderr


@pytest.mark.slow  # ~3 min on 2 busy cores: two launch/spa.py runs (SFT, RL) on gs://
def test_launch_spa_runs_its_stages_in_a_gcs_workdir(gcs, tmp_path):
  """tests/launch/test_spa_launch.py's run with the workdir on gs://: stage A's files given
  there, stage B's SFT policy exported there, stage C's metrics there; a rerun finds them."""
  from configs import frozenlake
  from tests.launch.test_spa_launch import _gold_chats

  c = frozenlake.get_config("tiny")
  chats = _gold_chats(c, 3)
  workdir = f"{gcs}/spa/run"
  spa_dir = epath.Path(f"{workdir}/spa")
  for name, part in (("train", chats[:2]), ("val", chats[2:])):
    (spa_dir / f"wm_{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in part))
  (spa_dir / "collect.json").write_text(json.dumps({"episodes": 3}))
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  from tests.launch.test_spa_launch import spa_command

  cmd = spa_command(workdir)
  env = _env(tmp_path)
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500, cwd=cwd)
  assert out.returncode == 0, out.stderr[-3000:]
  info = json.loads((spa_dir / "collect.json").read_text())
  assert info["sft_steps"] == 1 and info["val_loss_after"] < info["val_loss_before"]
  names = _objects(workdir)
  assert "spa/sft/hf/config.json" in names and "spa/sft_summary.json" in names, names
  assert any(n.startswith("spa/sft/hf/") and n.endswith(".safetensors") for n in names), names
  assert ".lock" not in names
  text = epath.Path(f"{workdir}/metrics.jsonl").read_text()
  rec = [json.loads(x) for x in text.splitlines() if x.strip()]
  assert len(rec) == 1 and rec[0]["eval/k"] == 2
  assert 0.0 <= rec[0]["eval/pass@1"] <= rec[0]["eval/pass@k"] <= 1.0
  again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "stages A and B skipped" in again.stdout
  assert os.listdir(cwd) == [], os.listdir(cwd)
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
