"""--import=MODULE_OR_FILE: a method defined in a file outside the repository trains through
launch/train.py and evaluates through launch/eval.py; sweeps come from a user's file too."""

import json
import subprocess
import sys
import textwrap

import pytest

from empo2_jax import cli
from empo2_jax.errors import UserError

# A whole method in a user's file (the shape of docs/architecture.md, "How to add a method").
METHOD = textwrap.dedent(
  '''
  from empo2_jax import methods


  class ExtBonus(methods.Plugin):
    name = "ext_bonus"
    section = {"enabled": False, "bonus": 0.25}

    def after_rollout(self, ctx, episodes, iteration, mode, key):
      n = 0
      for e in episodes:
        for t in e.turns:
          t.intrinsic += float(self.c.ext_bonus.bonus)
          n += 1
      return episodes, {"ext_bonus/turns": n}


  methods.register(
    "ext_bonus",
    "GRPO plus a constant bonus, defined outside the package",
    overrides={**methods.GRPO_OVERRIDES, "ext_bonus.enabled": True},
    plugin=ExtBonus,
  )
  '''
)


def _write(tmp_path, name="ext_method.py", text=METHOD):
  path = tmp_path / "user" / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return path


# one training iteration, no evaluation
ONE_ITERATION = (
  "--config.train.iterations=1",
  "--config.train.eval_every=0",
  "--config.train.eval_at_end=False",
  "--no_progress",
)


def _records(workdir):
  return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _launch(script, *args, timeout=900):
  return subprocess.run(
    [sys.executable, f"launch/{script}", *args], capture_output=True, text=True, timeout=timeout
  )


def test_import_values_reads_both_spellings():
  argv = ["prog", "--import=a.b", "--config=x", "--import", "c.py", "--imports=no"]
  assert cli.import_values(argv) == ["a.b", "c.py"]


def test_import_modules_refuses_a_missing_file_or_module(tmp_path):
  with pytest.raises(UserError, match=r"no such file.*\(--import\)"):
    cli.import_modules([str(tmp_path / "missing.py")])
  with pytest.raises(UserError, match=r"no module named 'no_such_pkg_xyz.m'"):
    cli.import_modules(["no_such_pkg_xyz.m"])


def test_train_with_a_missing_import_fails_in_one_line(tmp_path):
  out = _launch(
    "train.py",
    "--config=configs/frozenlake.py:tiny",
    f"--import={tmp_path / 'nope.py'}",
    f"--workdir={tmp_path / 'w'}",
    timeout=300,
  )
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1].startswith("error: no such file")


def test_sweep_from_a_user_file_passes_imports_to_every_run(tmp_path):
  method = _write(tmp_path)
  sweeps = _write(
    tmp_path,
    "my_sweeps.py",
    'SWEEPS = {"bonus": [{"method": "ext_bonus", "ext_bonus.bonus": b} for b in (0.5, 1.0)]}\n',
  )
  out = _launch(
    "sweep.py",
    "--config=configs/frozenlake.py:tiny",
    f"--sweep={sweeps}:bonus",
    f"--import={method}",
    f"--workdir={tmp_path / 'sw'}",
    "--dry_run",
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  runs = json.loads(out.stdout)
  assert [r["name"] for r in runs] == ["method=ext_bonus,bonus=0.5", "method=ext_bonus,bonus=1"]
  for r in runs:
    assert f"--import={method}" in r["command"]
    assert "--config.method=ext_bonus" in r["command"]


@pytest.mark.slow  # one tiny FrozenLake iteration and one evaluation, two processes: ~1-2 min
def test_a_method_from_a_user_file_trains_and_evaluates(tmp_path):
  method = _write(tmp_path)
  work = tmp_path / "run"
  common = ["--config=configs/frozenlake.py:tiny", f"--import={method}", f"--workdir={work}"]
  out = _launch(
    "train.py",
    *common,
    "--config.method=ext_bonus",
    "--config.ext_bonus.bonus=2.0",
    *ONE_ITERATION,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  rows = _records(work)
  train_variations = [r for r in rows if "ext_bonus/turns" in r]
  assert train_variations and train_variations[-1]["ext_bonus/turns"] > 0
  assert train_variations[-1]["intrinsic_mean"] == pytest.approx(2.0)

  out = _launch("eval.py", *common, "--method=ext_bonus", "--memory=without")
  assert out.returncode == 0, out.stderr[-3000:]
  res = json.loads((work / "eval" / "result.json").read_text())
  assert res["method"] == "ext_bonus"


# An advantage estimator with a config key of its own, in a user's file: every turn gets the
# key's value as its advantage, so the run's advantage_abs_mean shows what the estimator read.
ESTIMATOR = textwrap.dedent(
  """
  import numpy as np

  from empo2_jax.rl import advantages


  @advantages.register_estimator("ext_const", keys={"ext_const_value": 0.5})
  def ext_const(turns, ext_const_value=0.0):
    return np.full(len(turns), ext_const_value, np.float32)
  """
)


def test_an_estimator_key_from_a_user_file_parses_as_the_config_does(tmp_path):
  est = _write(tmp_path, "ext_estimator.py", ESTIMATOR)
  common = ["--config=configs/frozenlake.py:tiny", f"--workdir={tmp_path / 'w'}"]
  out = _launch("train.py", *common, "--config.advantage.ext_const_value=1.5", timeout=300)
  assert out.returncode == 2 and "ext_const_value" in out.stderr  # unknown without the import
  out = _launch(
    "train.py", *common, f"--import={est}", "--config.advantage.ext_const_value=abc", timeout=300
  )
  assert out.returncode == 2, out.stderr[-2000:]
  line = out.stderr.strip().splitlines()[-1]
  assert line.startswith("error: ") and "abc" in line  # a float key: "abc" does not parse
  assert not (tmp_path / "w").exists()


@pytest.mark.slow  # one tiny FrozenLake iteration: ~1 min
def test_an_estimator_from_a_user_file_reads_its_own_key(tmp_path):
  est = _write(tmp_path, "ext_estimator.py", ESTIMATOR)
  work = tmp_path / "run"
  out = _launch(
    "train.py",
    "--config=configs/frozenlake.py:tiny",
    f"--import={est}",
    f"--workdir={work}",
    "--config.advantage.estimator=ext_const",
    "--config.advantage.ext_const_value=1.5",
    *ONE_ITERATION,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  rows = _records(work)
  trained = [r for r in rows if "advantage_abs_mean" in r]
  assert trained and trained[-1]["advantage_abs_mean"] == pytest.approx(1.5)
