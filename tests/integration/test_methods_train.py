"""The exploration methods end to end in the trainer (configs/frozenlake.py:tiny, one iteration
each): SGE, HeRL, EMPO2 + RND; RND's state resumes exactly from a checkpoint. SPA's stages are in
tests/launch/test_spa_launch.py."""

import numpy as np
import pytest

import jax

from configs import frozenlake
from empo2_jax import config_keys, methods


def _config(method: str, **over):
  c = frozenlake.get_config("tiny")
  methods.apply(c, method)
  c.unlock()
  for k, v in over.items():
    node, key = config_keys.lookup(c, k)
    node[key] = v
  c.lock()
  return c


@pytest.mark.slow
def test_sge_one_iteration_records_strategy_temperatures(tmp_path):
  from empo2_jax.methods import sge
  from empo2_jax.train.trainer import Trainer

  c = _config("sge", **{"sge.strategy_max_new_tokens": 6})
  trainer = Trainer(c, str(tmp_path), progress=False)
  try:
    result = trainer.train_iteration()
    m = result.metrics
    temps = sge.group_temperatures(c.rollout.group_size, sge.parse_temperatures(
      c.sge.strategy_temperatures))  # fmt: skip
    for e in result.episodes:
      assert e.messages[0]["content"].startswith(sge.STRATEGY_INSTRUCTION)
      t_s = temps[e.rollout_id % c.rollout.group_size]
      for t in e.turns:
        assert len(t.token_temps) == len(t.response_ids)
        n_s = min(len(t.response_ids), c.sge.strategy_max_new_tokens)
        # the strategy phase at the rollout's temperature, the rest at the rollout temperature
        assert t.token_temps[:n_s] == [t_s] * n_s or sge.CLOSE in t.response
        assert set(t.token_temps) <= {t_s, c.rollout.temperature}
    assert "token_temperature" in result.batch
    assert np.isfinite(m["loss/pg_loss"]) and "sge/strategy_closed_frac" in m
  finally:
    trainer.close()


@pytest.mark.slow
def test_herl_one_iteration_injects_guided_episodes(tmp_path):
  from empo2_jax.train.trainer import Trainer

  c = _config("herl")
  trainer = Trainer(c, str(tmp_path), progress=False)
  try:
    result = trainer.train_iteration()
    m = result.metrics
    n_groups = c.rollout.variations_per_iter
    failed = sum(not any(e.success for e in result.episodes if e.group_id == g)
                 for g in range(n_groups))  # fmt: skip
    assert m["herl/groups_failed"] == failed
    assert m["herl/injected"] + m["herl/fallback_copies"] == failed
    if m["herl/injected"]:
      assert m["loss/shaped_token_frac"] > 0 and "shaping_gamma" in result.batch
    assert np.isfinite(m["loss/pg_loss"])
  finally:
    trainer.close()


@pytest.mark.slow
def _rnd(trainer):
  (plugin,) = [p for p in trainer.hooks.plugins if p.name == "rnd"]
  return plugin.rnd


def test_empo2_rnd_rewards_and_exact_resume(tmp_path):
  """Two iterations straight == one, a checkpoint, a new trainer resuming, one more: the RND
  networks, Adam state and statistics come back exactly."""
  from empo2_jax.train.trainer import Trainer

  over = {"empo2.force_mode": "on_tips", "train.checkpoint_every": 1, "train.iterations": 2}
  c = _config("empo2_rnd", **over)
  assert c.empo2.intrinsic_reward == "rnd"
  straight = Trainer(c, str(tmp_path / "a"), progress=False)
  hist = straight.run()
  assert hist[0]["rnd/rewarded"] == 1 and hist[0]["intrinsic_mean"] > 0
  want = jax.tree.map(np.asarray, _rnd(straight).state)

  first = Trainer(c, str(tmp_path / "b"), progress=False)
  first.run(iterations=1)
  again = Trainer(c, str(tmp_path / "b"), progress=False)
  assert again.resume() == 1
  again.run()
  got = jax.tree.map(np.asarray, _rnd(again).state)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)
  assert int(got.updates) == 2
