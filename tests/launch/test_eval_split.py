"""launch/eval.py --split: evaluating TRAIN (or dev) variations instead of test ones, the way a
setting (the exploration experiment's target task) is chosen without looking at test."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow  # a JVM and the tiny random-init policy: ~1 min
def test_eval_on_train_variations_records_the_split_and_the_variations(tmp_path):
  from empo2_jax.envs.scienceworld.env import SciWorldEnv

  out = subprocess.run(
    [
      sys.executable,
      "launch/eval.py",
      "--config=configs/sciworld.py:tiny",
      "--method=naive",
      "--split=train",
      "--config.env.num_train_variations=2",
      f"--workdir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "(train variations: 2;" in out.stdout
  res = json.loads((tmp_path / "eval" / "result.json").read_text())
  env = SciWorldEnv()
  try:
    train = env.variations("find-animal", "train")
  finally:
    env.close()
  assert res["split"] == "train" and res["variations"] == train[:2]
  assert res["episodes"] == 2
