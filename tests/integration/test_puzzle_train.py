"""One training iteration end to end on FrozenLake (configs/frozenlake.py:tiny): the registry
builds the pool, material and prompts, and the episodes, returns and memories follow the puzzle's
rules."""

import numpy as np
import pytest

from configs import frozenlake


@pytest.mark.slow
def test_frozenlake_tiny_trains_one_iteration(tmp_path):
  from empo2_jax.envs import frozenlake as fl
  from empo2_jax.train.trainer import Trainer

  config = frozenlake.get_config("tiny")
  config.empo2.force_mode = "on_tips"  # a memory iteration: tips are written and stored
  trainer = Trainer(config, str(tmp_path), progress=False)
  try:
    assert trainer.train_variations == [0, 1, 2, 3] and trainer.test_variations == [2_000_000]
    result = trainer.train_iteration()
    m, episodes = result.metrics, result.episodes
    assert m["mode"] == "on_tips" and m["env_failed"] == 0
    assert len(episodes) == config.rollout.variations_per_iter * config.rollout.group_size
    local = fl.FrozenLakeEnv(fl.FrozenLakeConfig(max_turns=config.env.max_steps))
    for e in episodes:
      assert e.task == "frozenlake" and e.variation in trainer.train_variations
      first = e.messages[0]["content"]
      assert first.startswith("You are solving the FrozenLake puzzle")
      # the first observation is the map of the episode's seed, as the env renders it
      assert local.reset("frozenlake", e.variation).observation in first
      assert 1 <= len(e.turns) <= config.env.max_steps
      assert e.episode_return == pytest.approx(sum(t.reward for t in e.turns))
      for t in e.turns:  # a turn's reward: 0 or 1 from the game, -0.1 for no valid action
        assert np.isclose(t.reward, [0.0, 1.0, -0.1, 0.9]).any()
    assert m["tips_written"] > 0 and m["memory_writes"] > 0
    texts = [trainer.memory.store.slot(k).texts for k in trainer.memory.store.keys()]
    stored = [t for slot in texts for t in slot if t is not None]
    assert stored and all("/100" not in t and "you got the score" in t for t in stored)
    assert np.isfinite(m["return_mean"]) and m["samples"] > 0
  finally:
    trainer.close()
