"""The method registry (methods/): defaults applied to the config, check_config, and
launch/train.py refusing methods that do not train."""

import subprocess
import sys

import pytest

from empo2_jax import cli, defaults
from empo2_jax import methods
from empo2_jax.train import build
from configs import sciworld


PAPER = ("naive", "reflexion", "retrospex", "gigpo", "gigpo_std", "grpo", "empo2")


def test_paper_methods_registered_and_their_overrides_exist():
  assert set(PAPER) <= set(methods.names())
  c = defaults.get_config()
  for name in methods.names():
    methods.check_overrides(c, name)  # raises naming the valid keys when a path is wrong
  assert methods.get("empo2").trains and methods.get("grpo").trains
  assert not methods.get("naive").trains and not methods.get("reflexion").trains


def test_apply_sets_defaults_and_keeps_explicit_keys():
  c = sciworld.get_config("tiny")
  assert c.method == "empo2" and c.empo2.p_memory > 0
  methods.apply(c, "grpo")
  assert c.method == "grpo" and c.empo2.p_memory == 0.0
  c = sciworld.get_config("tiny")
  c.advantage.use_std = True
  methods.apply(c, "gigpo", keep={"advantage.use_std"})
  assert c.advantage.estimator == "gigpo" and c.advantage.use_std is True
  c2 = sciworld.get_config("tiny")
  methods.apply(c2, "gigpo")
  assert c2.advantage.use_std is False  # GiGPO's code default: mean_norm (F_norm = 1)
  c.method = "gigpo_std"
  methods.apply(c)  # the config's own method
  assert c.advantage.use_std is True


def test_check_config_rejects_unknown_method_naming_the_valid_ones():
  c = sciworld.get_config("tiny")
  c.method = "ppo"
  with pytest.raises(build.ConfigError) as e:
    build.check_config(c)
  for name in PAPER:
    assert name in str(e.value)


def test_register_once_and_command_lines():
  with pytest.raises(ValueError, match="registered already"):
    methods.register("grpo", "again")
  with pytest.raises(methods.UnknownMethod, match="valid: "):
    methods.get("nope")
  m = methods.register("_tmp_test", "a test method", overrides={"empo2.p_memory": 0.5})
  try:
    assert m.trains and m.label == "_tmp_test"
    (line,) = cli.command_lines(m, "configs/sciworld.py:cpu", "runs/x y")
    assert line == (
      "python launch/train.py --config=configs/sciworld.py:cpu --config.method=_tmp_test "
      "--workdir='runs/x y'"
    )
  finally:
    del methods.REGISTRY["_tmp_test"]
  train, ev = cli.command_lines(methods.get("grpo"), "c.py", "w", evaluate=True)
  assert train.startswith("python launch/train.py") and "--config.method=grpo" in train
  assert ev == "python launch/eval.py --config=c.py --method=grpo --workdir=w"
  (line,) = cli.command_lines(methods.get("reflexion"), "c.py", "w", evaluate=True)
  assert line == "python launch/eval.py --config=c.py --method=reflexion --workdir=w"


def test_explicit_keys():
  argv = ["--config=x.py", "--config.empo2.p_memory=0.1", "--config.seed", "3", "--noconfig.a.b"]
  assert cli.explicit_keys(argv) == {"empo2.p_memory", "seed", "a.b"}


def test_train_refuses_a_method_that_does_not_train(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "launch/train.py",
      "--config=configs/sciworld.py:tiny",
      "--config.method=reflexion",
      f"--workdir={tmp_path / 'w'}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode != 0
  assert "launch/eval.py" in out.stderr and "--method=reflexion" in out.stderr
  assert not (tmp_path / "w").exists()


def test_table1_sweep_commands_cover_every_method_and_task():
  from configs import sweeps
  from empo2_jax.envs.scienceworld.env import PAPER_TASKS

  lines = sweeps.table1_commands("R")
  assert len(lines) == 18 * 10 + 1 and lines[-1] == "python launch/table.py --runs=R --out=R/table"
  for task in PAPER_TASKS:
    mine = [ln for ln in lines if f"--workdir=R/{task}/" in ln]
    order = [
      next(m for m in sweeps.TABLE1_METHODS if f"--workdir=R/{task}/{m} " in ln + " ")
      for ln in mine
    ]
    assert order == [
      "naive",
      "reflexion",
      "grpo",
      "grpo",
      "gigpo",
      "gigpo",
      "empo2",
      "empo2",
      "retrospex",
      "retrospex",
    ]
    assert f"--episodes=R/{task}/grpo" in mine[8] and "save_episodes=True" in mine[2]
  assert all('--config.model.checkpoint="$QWEN"' in ln for ln in lines[:-1])
  cpu = sweeps.table1_commands("C", cpu=True)
  assert len(cpu) == 2 * 10 + 1 and all("sciworld.py:cpu,task=" in ln for ln in cpu[:-1])
  assert all("--config.train.iterations=1" in ln for ln in cpu if "launch/train.py" in ln)
  assert "--trials=3" in cpu[1] and "--steps=200" in cpu[8]


def test_table1_training_runs_expand_through_launch_sweep(tmp_path):
  from launch import sweep

  runs = sweep.expand("configs/sciworld.py:cpu", "configs/sweeps.py:table1_cpu", str(tmp_path), [])
  assert [r["name"] for r in runs] == [
    f"{m}_{t}" for t in ("find-animal", "power-component") for m in ("grpo", "gigpo", "empo2")
  ]
  assert runs[0]["overrides"]["train.save_episodes"] is True


def test_only_an_active_method_that_asks_gets_episode_records():
  """Plugin.episode_records reaches the actor's settings: SPA's env states are recorded in its
  runs only (agent/episode.RECORDS)."""
  from configs import frozenlake
  from empo2_jax.train import settings

  c = frozenlake.get_config("tiny")
  assert methods.episode_records(c) == () and settings.actor_settings(c).records == ()
  methods.apply(c, "spa")
  assert settings.actor_settings(c).records == ("states",)
