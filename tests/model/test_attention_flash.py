"""Blockwise attention with its own backward (model/attention.py, attention_impl="flash") equals
the full score matrix (`llama._attend`) in values and gradients; a whole model agrees flash vs
dense.

Tolerances are relative to the compared array's scale: max|a - b| <= RTOL * max|b| with RTOL =
2e-5 (float32; the measured errors were 1e-7 - 5e-7 of the scale: kernel outputs and q/k/v
gradients <= 4.4e-7, the tiny model's logits 2.4e-7 and parameter gradients 4.5e-7); bfloat16
inputs against float32: 3e-2 (measured 4.4e-3)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.model import llama
from empo2_jax.model.attention import flash_attention
from empo2_jax.model.configs import get_preset

RTOL = 2e-5  # of max|reference|, float32


def _close(got, want, rtol=RTOL):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.isfinite(got).all()
  scale = np.abs(want).max()
  err = np.abs(got - want).max()
  assert err <= rtol * scale, f"max error {err:.3g} > {rtol} x scale {scale:.3g}"
  return err / scale


def _masks(kind, b, t, rng):
  m = np.ones((b, t), np.int32)
  if kind == "left":
    for i in range(b):
      m[i, : rng.integers(1, t // 2)] = 0
  elif kind == "right":
    for i in range(b):
      m[i, rng.integers(t // 2, t) :] = 0
  elif kind == "packed":  # spans of real tokens with holes (removed tips) and right padding
    for i in range(b):
      for _ in range(3):
        a = rng.integers(1, t - 4)
        m[i, a : a + rng.integers(1, 5)] = 0
      m[i, t - rng.integers(0, t // 4) :] = 0
  elif kind == "mixed":  # left padding, a hole, right padding; one row without any real token
    m[0, :5] = 0
    m[1, 10:13] = 0
    m[1, t - 7 :] = 0
    m[-1] = 0
  return m


CASES = [  # (B, T, K, G, hd, block, mask kind)
  (2, 64, 2, 1, 16, 16, "none"),  # MHA, T a multiple of the block
  (3, 70, 2, 3, 16, 16, "left"),  # GQA, T not a multiple of the block
  (2, 70, 1, 4, 8, 32, "right"),  # multi-query
  (3, 53, 3, 3, 32, 8, "packed"),  # many tiles
  (3, 40, 2, 2, 16, 0, "mixed"),  # one tile
  (3, 40, 2, 2, 16, 64, "mixed"),  # a block longer than T
]


def _inputs(b, t, k, g, hd, seed):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, k * g, hd)).astype(np.float32)
  kk = rng.normal(size=(b, t, k, hd)).astype(np.float32)
  v = rng.normal(size=(b, t, k, hd)).astype(np.float32)
  return rng, jnp.asarray(q), jnp.asarray(kk), jnp.asarray(v)


@pytest.mark.parametrize("b,t,k,g,hd,block,kind", CASES)
def test_values_and_gradients_equal_full_matrix(b, t, k, g, hd, block, kind):
  rng, q, kk, v = _inputs(b, t, k, g, hd, seed=t + block)
  mask = _masks(kind, b, t, rng)
  allowed = np.tril(np.ones((t, t), bool))[None] & (mask[:, None, :] > 0)
  seen = allowed.any(-1)  # [B, T]: queries with at least one allowed key
  # A random linear functional of the output on the queries that see a key (`_attend` gives the
  # others a uniform average over disallowed keys; flash gives zeros: checked below).
  w = jnp.asarray(rng.normal(size=(b, t, k * g * hd)) * seen[..., None], jnp.float32)

  def ref(q, kk, v):
    return llama._attend(q, kk, v, jnp.asarray(allowed), jnp.float32)

  def flash(q, kk, v):
    return flash_attention(q, kk, v, mask, block=block, dtype=jnp.float32)

  ref, flash = jax.jit(ref), jax.jit(flash)
  out, want = flash(q, kk, v), ref(q, kk, v)
  _close(np.asarray(out)[seen], np.asarray(want)[seen])
  assert np.all(np.asarray(out)[~seen] == 0)

  g_ref = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * w), (0, 1, 2)))(q, kk, v)
  g_fl = jax.jit(jax.grad(lambda *a: jnp.sum(flash(*a) * w), (0, 1, 2)))(q, kk, v)
  for got, want_g in zip(g_fl, g_ref):
    _close(got, want_g)


def test_query_without_keys_has_zero_output_and_gradient():
  _, q, kk, v = _inputs(2, 24, 2, 2, 8, seed=3)
  mask = np.ones((2, 24), np.int32)
  mask[0, :10] = 0  # queries 0..9 of row 0 see no key
  mask[1] = 0  # row 1: nothing at all

  def f(q, kk, v):
    return flash_attention(q, kk, v, mask, block=8, dtype=jnp.float32)

  out = np.asarray(jax.jit(f)(q, kk, v))
  assert np.all(out[0, :10] == 0) and np.all(out[1] == 0) and np.isfinite(out).all()
  gq, gk, gv = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2 + f(*a)), (0, 1, 2)))(q, kk, v)
  for grad in (gq, gk, gv):
    assert np.isfinite(np.asarray(grad)).all()
  assert np.all(np.asarray(gq)[0, :10] == 0) and np.all(np.asarray(gq)[1] == 0)
  assert np.all(np.asarray(gk)[1] == 0) and np.all(np.asarray(gv)[1] == 0)
  assert np.all(np.asarray(gk)[0, :10] == 0)  # padded keys get no gradient


def test_bfloat16_inputs_stay_close_to_float32():
  rng, q, kk, v = _inputs(2, 48, 2, 2, 16, seed=5)
  mask = _masks("packed", 2, 48, rng)
  want = flash_attention(q, kk, v, mask, block=16, dtype=jnp.float32)
  bf = [x.astype(jnp.bfloat16) for x in (q, kk, v)]
  got = flash_attention(*bf, mask, block=16, dtype=jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  _close(got.astype(jnp.float32), want, rtol=3e-2)  # bf16 inputs: ~8 mantissa bits


def test_causal_tiles_above_the_diagonal_are_skipped():
  from empo2_jax.model.attention import _tiles

  bk, tiles = _tiles(100, 100, 32, causal=True)
  # query tile i: i whole key tiles below the diagonal (the loop), then the diagonal tile alone
  assert bk == 32 and [run for _, run, _ in tiles] == [0, 1, 2, 3]
  assert [rest for _, _, rest in tiles] == [
    [(0, 32, True)],
    [(32, 64, True)],
    [(64, 96, True)],
    [(96, 100, True)],
  ]
  _, full = _tiles(100, 100, 32, causal=False)
  assert [(run, len(rest)) for _, run, rest in full] == [(3, 1)] * 4  # 16 tiles: nothing skipped


def _model_inputs(c, seed):
  rng = np.random.default_rng(seed)
  tok = rng.integers(0, c.vocab_size, (3, 70))
  mask = np.ones((3, 70), np.int32)
  mask[1, :9] = 0  # left padding
  mask[2, 50:] = 0  # right padding
  mask[0, 30:33] = 0  # a hole
  return tok, mask


def test_model_forward_and_gradients_flash_equal_dense():
  block = 32  # 3 query tiles over 70 positions: the loop, the diagonal and a short last tile
  c = get_preset("tiny").replace(attention_impl="dense", attention_block=0)
  params = llama.init_params(c, jax.random.key(2))
  tok, mask = _model_inputs(c, seed=2)
  flash = c.replace(attention_impl="flash", attention_block=block)

  def loss(p, cfg, tok, mask):  # tokens as arguments: XLA would constant-fold the loss's scatter
    logits = llama.forward(p, cfg, tok, mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1)[..., 0]
    return -jnp.sum(picked * mask[:, 1:] * mask[:, :-1]), logits  # predicted from a real position

  grad = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)
  g_dense, logits_dense = grad(params, c, tok, mask)
  g_flash, logits_flash = grad(params, flash, tok, mask)
  real = mask > 0
  _close(np.asarray(logits_flash)[real], np.asarray(logits_dense)[real])
  for a, b in zip(jax.tree.leaves(g_flash), jax.tree.leaves(g_dense)):
    _close(a, b)


def test_unknown_impl_is_refused():
  with pytest.raises(ValueError, match="attention_impl"):
    get_preset("tiny").replace(attention_impl="sparse")
