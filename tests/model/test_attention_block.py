"""Causal query-block attention (the dense path, LlamaConfig.attention_block) equals the full
score matrix; the flash kernel has its own tests (tests/model/test_attention_flash.py)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.model import llama
from empo2_jax.model.configs import get_preset


def _inputs(c, seed=0):
  rng = np.random.default_rng(seed)
  tok = rng.integers(0, c.vocab_size, (3, 70))
  mask = np.ones((3, 70), np.int32)
  mask[1, :9] = 0  # left padding
  mask[2, 50:] = 0  # right padding
  return tok, mask


@pytest.mark.parametrize("block", [16, 32, 69, 70, 200])
def test_blocked_forward_equals_full_on_real_positions(block):
  c = get_preset("tiny").replace(attention_block=0, attention_impl="dense")
  params = llama.init_params(c, jax.random.key(0))
  tok, mask = _inputs(c)
  full = np.asarray(llama.forward(params, c, tok, mask))
  out = np.asarray(llama.forward(params, c.replace(attention_block=block), tok, mask))
  real = mask > 0
  np.testing.assert_allclose(out[real], full[real], rtol=0, atol=2e-6)


def test_blocked_gradients_equal_full():
  c = get_preset("tiny").replace(attention_block=0, attention_impl="dense")
  params = llama.init_params(c, jax.random.key(1))
  tok, mask = _inputs(c, seed=1)

  def loss(p, cfg):
    logits = llama.forward(p, cfg, tok, mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1)[..., 0]
    return -jnp.sum(picked * mask[:, 1:] * mask[:, :-1])  # predicted from a real position

  g_full = jax.grad(loss)(params, c)
  g_blk = jax.grad(loss)(params, c.replace(attention_block=16))
  for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_blk)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_negative_block_is_refused():
  with pytest.raises(ValueError, match="attention_block"):
    get_preset("tiny").replace(attention_block=-1)
