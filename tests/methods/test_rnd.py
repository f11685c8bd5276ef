"""RND (methods/rnd.py): statistics, normalisation and reward against numpy; predictor training."""

import numpy as np
import pytest

import jax

from empo2_jax.methods import rnd


def _np_mlp(params, x):
  """The Flax MLP in numpy: Dense -> ReLU -> Dense -> ReLU -> Dense."""
  layers = params["params"]
  names = sorted(layers, key=lambda k: int(k.split("_")[-1]))
  for i, name in enumerate(names):
    x = x @ np.asarray(layers[name]["kernel"]) + np.asarray(layers[name]["bias"])
    if i + 1 < len(names):
      x = np.maximum(x, 0.0)
  return x


def test_running_stats_equal_numpy_over_batches():
  rng = np.random.default_rng(0)
  batches = [rng.normal(3.0, 2.0, size=(n, 5)) for n in (1, 7, 30, 2)]
  stats = rnd.new_stats(5)
  for b in batches:
    stats = rnd.update_stats(stats, b)
  allx = np.concatenate(batches)
  np.testing.assert_allclose(stats.mean, allx.mean(0), rtol=1e-5)
  np.testing.assert_allclose(stats.var, allx.var(0), rtol=1e-4)
  assert float(stats.count) == len(allx)
  assert rnd.update_stats(stats, np.zeros((0, 5))) is stats


def test_normalise_obs_clips_like_numpy():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(6, 4)) * 10
  stats = rnd.RunningStats(np.array([0.5, -1, 2, 0]), np.array([0.01, 4, 1, 9]), np.float32(3))
  want = np.clip((x - stats.mean) / np.sqrt(stats.var + 1e-8), -5, 5)
  np.testing.assert_allclose(np.asarray(rnd.normalise_obs(stats, x, 5.0)), want, rtol=1e-5)
  assert np.abs(np.asarray(rnd.normalise_obs(stats, x, 5.0))).max() <= 5.0


def test_discounted_returns_per_episode():
  r = [1.0, 2.0, 4.0, 10.0, 20.0]
  ep = ["a", "a", "a", "b", "b"]
  steps = [2, 0, 1, 0, 1]  # unordered input: the filter runs in step order
  got = rnd.discounted_returns(r, ep, steps, 0.5)
  # a: step0 r=2 -> 2; step1 r=4 -> 0.5*2+4 = 5; step2 r=1 -> 0.5*5+1 = 3.5. b: 10, 25
  np.testing.assert_allclose(got, [3.5, 2.0, 5.0, 10.0, 25.0])


def test_minmax_range_and_constant_batch():
  np.testing.assert_allclose(rnd.minmax([2.0, 4.0, 3.0]), [0.0, 1.0, 0.5])
  np.testing.assert_array_equal(rnd.minmax([1.0, 1.0]), [0.0, 0.0])


def test_reward_equals_numpy_reference():
  """Raw error = mean squared difference of the two numpy MLPs on the normalised embedding."""
  cfg = rnd.RNDConfig(
    scale=1.0, seed=0, input_dim=8, hidden=16, out=4, normalise="none", row_bucket=4
  )
  model = rnd.RND(cfg, encoder=None)
  x = np.random.default_rng(2).normal(size=(5, 8)).astype(np.float32)
  s0 = model.state
  got, stats = model.rewards_from_embeddings(x, ["e"] * 5, range(5))
  mean, var = x.mean(0), x.var(0)  # the batch is its own warm-up: stats = this batch
  xn = np.clip((x - mean) / np.sqrt(var + 1e-8), -5, 5)
  want = np.mean((_np_mlp(s0.predictor, xn) - _np_mlp(s0.target, xn)) ** 2, axis=-1)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  # the statistics come back with the rewards (nothing is left on the object)
  assert stats["rnd/error_mean"] == pytest.approx(want.mean(), rel=1e-4)
  assert stats["rnd/error_max"] == pytest.approx(want.max(), rel=1e-4)
  assert stats["rnd/reward_mean"] == pytest.approx(want.mean(), rel=1e-4)
  assert model.rewards_from_embeddings(x[:0], [], [])[1] == {}
  assert not [k for k in vars(model) if k.startswith("last_")]
  # the target is frozen; the predictor moved
  for a, b in zip(jax.tree.leaves(s0.target), jax.tree.leaves(model.state.target)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = [
    np.abs(np.asarray(a) - np.asarray(b)).max()
    for a, b in zip(jax.tree.leaves(s0.predictor), jax.tree.leaves(model.state.predictor))
  ]
  assert max(moved) > 0
  assert int(model.state.updates) == 1


def test_minmax_and_std_normalisers_vs_numpy():
  x = np.random.default_rng(3).normal(size=(6, 8)).astype(np.float32)
  ep, steps = ["a", "a", "a", "b", "b", "b"], [0, 1, 2, 0, 1, 2]
  raw = rnd.RND(
    rnd.RNDConfig(scale=1.0, seed=0, input_dim=8, hidden=16, out=4, normalise="none"), None
  )
  want_raw = raw.rewards_from_embeddings(x, ep, steps)[0].astype(np.float64)

  mm = rnd.RND(
    rnd.RNDConfig(scale=2.0, seed=0, input_dim=8, hidden=16, out=4, normalise="minmax"), None
  )
  got = mm.rewards_from_embeddings(x, ep, steps)[0]
  lo, hi = want_raw.min(), want_raw.max()
  np.testing.assert_allclose(got, 2.0 * (want_raw - lo) / (hi - lo), rtol=1e-4, atol=1e-6)

  sd = rnd.RND(
    rnd.RNDConfig(scale=1.0, seed=0, input_dim=8, hidden=16, out=4, normalise="std", gamma=0.9),
    None,
  )
  got = sd.rewards_from_embeddings(x, ep, steps)[0]
  ret = []
  for e in ("a", "b"):
    run = 0.0
    for r in want_raw[[i for i in range(6) if ep[i] == e]]:
      run = 0.9 * run + r
      ret.append(run)
  np.testing.assert_allclose(got, want_raw / np.sqrt(np.var(ret) + 1e-8), rtol=1e-4)
  assert float(sd.state.ret.count) == 6


def test_predictor_training_lowers_error_on_repeated_states():
  cfg = rnd.RNDConfig(scale=1.0, seed=0, input_dim=16, hidden=32, out=8, lr=1e-2, normalise="none")
  model = rnd.RND(cfg, None)
  rng = np.random.default_rng(4)
  seen = rng.normal(size=(8, 16)).astype(np.float32)
  first = model.rewards_from_embeddings(seen, list(range(8)), [0] * 8)[0].mean()
  for _ in range(60):
    last = model.rewards_from_embeddings(seen, list(range(8)), [0] * 8)[0].mean()
  assert last < 0.2 * first
  # a state never trained on keeps a large error: novelty is rewarded
  novel = rng.normal(size=(8, 16)).astype(np.float32) * 3
  both, _ = model.rewards_from_embeddings(np.concatenate([seen, novel]), list(range(16)), [0] * 16)
  assert both[8:].mean() > 3 * both[:8].mean()


def test_config_errors_name_valid_values():
  with pytest.raises(ValueError, match="minmax, std, none"):
    rnd.RNDConfig(scale=1.0, seed=0, normalise="max")


@pytest.mark.slow
def test_rewards_with_the_minilm_encoder():
  """Texts go through the real frozen encoder: equal texts get equal rewards."""
  from empo2_jax.model.encoder import Encoder

  enc = Encoder.load()
  model = rnd.RND(rnd.RNDConfig(scale=1.0, seed=0, normalise="none"), enc)
  assert model.cfg.input_dim == enc.dim
  texts = ["You are at (0, 0).", "You are at (0, 0).", "A hole is below you."]
  r, _ = model.rewards(texts, [0, 1, 2], [0, 0, 0])
  assert r.shape == (3,) and r[0] == pytest.approx(r[1]) and r[0] != pytest.approx(r[2])
