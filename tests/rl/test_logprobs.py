"""Chunked log-probs == full-logits log-probs (values and gradients), and stay finite."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from empo2_jax.model import llama
from tests.helpers.tiny_model import TINY
from empo2_jax.rl.logprobs import naive_token_logprobs, response_logprobs, token_logprobs


def numpy_reference(h, w, t, temp):
  z = (h.astype(np.float64) @ w.astype(np.float64)) / temp
  z = z - z.max(-1, keepdims=True)
  logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
  p = np.exp(logp_all)
  return np.take_along_axis(logp_all, t[..., None], -1)[..., 0], -(p * logp_all).sum(-1)


def inputs(seed, B=3, T=5, D=16, V=300, scale=1.0):
  rng = np.random.default_rng(seed)
  h = rng.normal(0, scale, (B, T, D)).astype(np.float32)
  w = rng.normal(0, 1.0, (D, V)).astype(np.float32)
  t = rng.integers(0, V, (B, T)).astype(np.int32)
  t[0, 0], t[0, 1] = V - 1, 0  # first and last vocabulary entries (tail chunk)
  return h, w, t


@pytest.mark.parametrize("chunk", [64, 100, 300, 1000])  # divides, tail chunk, one, larger than V
@pytest.mark.parametrize("temp", [1.0, 0.4])
def test_values_match_numpy(chunk, temp):
  h, w, t = inputs(0)
  logp, ent = token_logprobs(
    jnp.asarray(h),
    jnp.asarray(w),
    jnp.asarray(t),
    temperature=temp,
    chunk_size=chunk,
    with_entropy=True,
  )
  want_lp, want_ent = numpy_reference(h, w, t, temp)
  np.testing.assert_allclose(logp, want_lp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [64, 100])
def test_gradients_match_naive(chunk):
  h, w, t = (jnp.asarray(x) for x in inputs(1))
  rng = np.random.default_rng(2)
  c_lp = jnp.asarray(rng.normal(size=t.shape), jnp.float32)
  c_ent = jnp.asarray(rng.normal(size=t.shape), jnp.float32)

  def objective(fn):
    def f(h, w):
      lp, ent = fn(h, w, t, temperature=0.7, with_entropy=True)
      return jnp.sum(c_lp * lp) + jnp.sum(c_ent * ent)

    return f

  chunked = objective(lambda *a, **k: token_logprobs(*a, chunk_size=chunk, **k))
  gh, gw = jax.jit(jax.grad(chunked, argnums=(0, 1)))(h, w)
  nh, nw = jax.grad(objective(naive_token_logprobs), argnums=(0, 1))(h, w)
  np.testing.assert_allclose(gh, nh, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gw, nw, rtol=1e-5, atol=1e-5)
  # logp-only gradient (entropy cotangent is a symbolic zero)
  g_only = jax.grad(lambda h: jnp.sum(token_logprobs(h, w, t, chunk_size=chunk)))(h)
  n_only = jax.grad(lambda h: jnp.sum(naive_token_logprobs(h, w, t)))(h)
  np.testing.assert_allclose(g_only, n_only, rtol=1e-5, atol=1e-5)


def test_extreme_logits_finite():
  h, w, t = inputs(3, scale=200.0)  # logits in the thousands: exp would overflow naively
  logp, ent = token_logprobs(
    jnp.asarray(h), jnp.asarray(w), jnp.asarray(t), chunk_size=64, with_entropy=True
  )
  assert np.all(np.isfinite(logp)) and np.all(np.isfinite(ent)) and np.all(np.asarray(logp) <= 0)
  g = jax.grad(lambda h: jnp.sum(token_logprobs(h, jnp.asarray(w), jnp.asarray(t), chunk_size=64)))(
    jnp.asarray(h)
  )
  assert np.all(np.isfinite(g))
  want_lp, _ = numpy_reference(h, w, t, 1.0)
  np.testing.assert_allclose(logp, want_lp, rtol=1e-4, atol=1e-2)


def test_bfloat16_inputs_close_to_float32():
  h, w, t = inputs(4)
  lp16 = token_logprobs(
    jnp.asarray(h, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), jnp.asarray(t), chunk_size=64
  )
  assert lp16.dtype == jnp.float32
  np.testing.assert_allclose(lp16, numpy_reference(h, w, t, 1.0)[0], atol=0.3)


def test_response_logprobs_match_full_forward():
  cfg = TINY
  params = llama.init_params(cfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(5)
  B, L, R = 3, 12, 4
  tokens = rng.integers(0, 512, (B, L)).astype(np.int32)
  attn = np.ones((B, L), np.int32)
  attn[1, :3] = 0  # left-padded prompt
  attn[2, -1] = 0  # right-padded response
  lp = jax.jit(lambda p, t, a: response_logprobs(p, cfg, t, a, R, chunk_size=100))(
    params, jnp.asarray(tokens), jnp.asarray(attn)
  )
  logits = jax.jit(lambda p, t, a: llama.forward(p, cfg, t, a))(
    params, jnp.asarray(tokens), jnp.asarray(attn)
  )
  full = jax.nn.log_softmax(logits, -1)
  want = np.take_along_axis(np.asarray(full[:, L - R - 1 : L - 1]), tokens[:, L - R :, None], -1)[
    ..., 0
  ]
  np.testing.assert_allclose(lp, want, rtol=1e-5, atol=1e-5)
