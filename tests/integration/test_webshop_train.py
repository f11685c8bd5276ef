"""WebShop through the registry and the trainer: configs/webshop.py, one tiny training iteration end
to end (pool workers, prompts, rewards, memories), and `launch/train.py` on the tiny config."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import webshop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_configs_and_their_checks():
  from empo2_jax.envs import registry
  from empo2_jax.envs.webshop import suite
  from empo2_jax.train import build

  assert "webshop" in registry.names()
  for arg in ("cpu", "tiny", "cpu,human"):
    c = webshop.get_config(arg)
    build.check_config(c)
    cfg = suite.env_config(c)
    assert cfg.observation == "agent" and cfg.max_steps == c.env.max_steps
  c = webshop.get_config()
  assert (c.env.max_steps, c.env.num_test, c.env.num_test_variations) == (15, 500, 128)
  assert c.env.goals == "synthetic" and c.env.data_dir == ""
  with pytest.raises(ValueError, match="valid: cpu, tiny, human"):
    webshop.get_config("gpu")
  c = webshop.get_config("tiny")
  c.unlock()
  c.env.data_dir = "/no/such/dir"
  with pytest.raises(build.ConfigError, match="does not exist"):
    build.check_config(c)
  c.env.data_dir = ""
  c.env.search_backend = "lucene9"
  with pytest.raises(build.ConfigError, match="valid: lucene, bm25s"):
    build.check_config(c)


@pytest.mark.slow
def test_webshop_tiny_trains_one_iteration(tmp_path):
  from empo2_jax.envs.webshop.env import WebShopConfig, WebShopEnv
  from empo2_jax.train.trainer import Trainer

  config = webshop.get_config("tiny")
  config.empo2.force_mode = "on_tips"  # a memory iteration: tips are written and stored
  trainer = Trainer(config, str(tmp_path), progress=False)
  try:
    local = WebShopEnv(WebShopConfig(observation="agent"))
    assert trainer.train_variations == local.variations("webshop", "train")
    assert trainer.test_variations == [0]
    result = trainer.train_iteration()
    m, episodes = result.metrics, result.episodes
    assert m["mode"] == "on_tips" and m["env_failed"] == 0
    assert len(episodes) == config.rollout.variations_per_iter * config.rollout.group_size
    for e in episodes:
      goal = local.catalog.goals[e.variation]
      first = e.messages[0]["content"]
      assert first.startswith("You are an expert autonomous agent operating in the WebShop")
      assert f"Your task is to: {goal['instruction_text']}." in first
      assert local.reset("webshop", e.variation).observation in first
      assert 1 <= len(e.turns) <= config.env.max_steps
      # A random policy never buys: every reward is 0, and so is the return (the score).
      assert e.episode_return == sum(t.reward for t in e.turns) == 0.0
    assert m["tips_written"] > 0 and m["memory_writes"] > 0
    assert np.isfinite(m["return_mean"]) and m["samples"] > 0
  finally:
    trainer.close()


@pytest.mark.slow
def test_launch_train_runs_the_tiny_config(tmp_path):
  workdir = tmp_path / "ws_tiny"
  out = subprocess.run(
    [
      sys.executable,
      "launch/train.py",
      "--config=configs/webshop.py:tiny",
      f"--workdir={workdir}",
      "--config.train.iterations=1",
      "--no_progress",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "done iterations=1" in out.stdout + out.stderr
  assert (workdir / "metrics.jsonl").exists() or any(workdir.iterdir())
  # the process's peak resident size, in the done line and in the iteration's metrics
  done = next(ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("done "))
  assert float(done.split("peak_rss_gib=")[1].split()[0]) > 0
  rec = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
  assert rec["host/peak_rss_gib"] > 0 and rec["host/children_rss_gib"] >= 0
