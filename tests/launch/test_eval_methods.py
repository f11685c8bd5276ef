"""launch/eval.py --method: Reflexion end to end on the tiny config (ScienceWorld JVM), and the
methods it does not run."""

import json
import subprocess
import sys

import pytest


def _eval(*args, timeout=600):
  return subprocess.run(
    [sys.executable, "launch/eval.py", "--config=configs/sciworld.py:tiny", *args],
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_unknown_and_retrospex_methods_are_refused(tmp_path):
  out = _eval("--method=ppo", f"--workdir={tmp_path}")
  assert out.returncode != 0 and "valid: " in out.stderr and "reflexion" in out.stderr
  out = _eval("--method=retrospex", f"--workdir={tmp_path}")
  assert out.returncode != 0 and "launch/retrospex.py train" in out.stderr


@pytest.mark.slow  # a JVM and the tiny policy: ~1 min
def test_reflexion_writes_result_with_per_trial_curve(tmp_path):
  out = _eval("--method=reflexion", "--trials=2", "--reflection_tokens=8", f"--workdir={tmp_path}")
  assert out.returncode == 0, out.stderr[-3000:]
  res = json.loads((tmp_path / "eval" / "result.json").read_text())
  assert res["method"] == "reflexion" and res["task"] == "find-animal"
  assert res["env"] == "scienceworld" and res["episodes"] == 1  # tiny: one test variation
  assert [t["trial"] for t in res["trials"]] == [1, 2]
  assert res["return_mean"] == res["trials"][-1]["return_mean"]
  assert "reflexion, trial 2" in (tmp_path / "eval" / "table.md").read_text()
