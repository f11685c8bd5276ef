"""kernels.categorical (the sampler's inverse-CDF draw) against numpy's softmax."""

import numpy as np

import jax
import jax.numpy as jnp

from empo2_jax.sampling import kernels


def _frequencies(x: np.ndarray, draws: int, seed: int = 0) -> np.ndarray:
  """Frequencies of `draws` draws; checks each draw's log-probability against numpy's."""
  keys = jax.random.split(jax.random.key(seed), draws)
  toks, lps = jax.jit(jax.vmap(kernels.categorical, (0, None)))(keys, jnp.asarray(x))
  toks, lps = np.asarray(toks), np.asarray(lps)
  assert toks.dtype == np.int32 and toks.min() >= 0 and toks.max() < len(x)
  x64 = x.astype(np.float64)
  log_softmax = x64 - x64.max() - np.log(np.exp(x64 - x64.max()).sum())
  np.testing.assert_allclose(lps, log_softmax[toks], rtol=1e-5, atol=1e-5)
  return np.bincount(toks, minlength=len(x)) / draws


def test_draws_follow_softmax_across_blocks():
  # 700 entries: three blocks of CDF_BLOCK, the last one padded; mass in every block
  rng = np.random.default_rng(0)
  x = rng.standard_normal(700).astype(np.float32)
  x[[5, 300, 650]] += 4.0
  want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
  freq = _frequencies(x, 40_000)
  assert 0.5 * np.abs(freq - want).sum() < 0.05
  for i in (5, 300, 650):  # the heavy entries, each ~0.2 of the mass, within 4 standard errors
    assert abs(freq[i] - want[i]) < 4 * np.sqrt(want[i] * (1 - want[i]) / 40_000), i


def test_never_draws_an_entry_of_zero_probability():
  x = np.full(600, -np.inf, np.float32)
  x[[0, 255, 256, 599]] = [0.0, 1.0, -1.0, 2.0]  # the edges of blocks, the last entry
  freq = _frequencies(x, 4_000, seed=1)
  assert set(np.flatnonzero(freq)) == {0, 255, 256, 599}
  want = np.exp(x[[0, 255, 256, 599]] - 2.0)
  np.testing.assert_allclose(freq[[0, 255, 256, 599]], want / want.sum(), atol=0.03)


def test_one_finite_entry_is_always_drawn():
  x = np.full(300, -np.inf, np.float32)
  x[257] = -50.0
  assert _frequencies(x, 64, seed=2)[257] == 1.0
