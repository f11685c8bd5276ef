"""Fused gradient accumulation (model/grad_accum.py): the layers' gradient added into the
accumulator in the backward equals accumulator + jax.grad of the plain remat forward; the update
with it equals the update without it; and the compiled update plans less memory."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from empo2_jax.model import llama
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.rl.update import init_train_state, make_update_fn
from tests.helpers.rl_settings import loss_config, update_config
from tests.rl.test_update import make_batch

MODEL = LlamaConfig(
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_layers=3,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  remat="full",
  attention_block=4,
)


def packed_inputs(seed, rows=3, length=12):
  """Rows of 1-3 packed segments with right padding (segment ids restart positions)."""
  rng = np.random.default_rng(seed)
  tok = rng.integers(0, MODEL.vocab_size, (rows, length)).astype(np.int32)
  attn = np.zeros((rows, length), np.int32)
  for r in range(rows):
    used = rng.integers(length // 2, length + 1)
    cuts = np.sort(rng.choice(np.arange(1, used), rng.integers(0, 3), replace=False))
    for seg, (a, b) in enumerate(zip([0, *cuts], [*cuts, used])):
      attn[r, a:b] = seg + 1
  return jnp.asarray(tok), jnp.asarray(attn)


def loss(params, config, tok, attn, weights, layer_grads=None):
  hidden = llama.forward(params, config, tok, attn, return_hidden=True, layer_grads=layer_grads)
  return jnp.sum(jnp.tanh(hidden) * weights * (attn[..., None] > 0))


@pytest.mark.parametrize("impl", ["flash", "dense"])
def test_accumulator_cotangent_is_acc_plus_layer_gradient(impl):
  config = dataclasses.replace(MODEL, attention_impl=impl)
  params = llama.init_params(config, jax.random.PRNGKey(0), std=0.2)
  tok, attn = packed_inputs(1)
  weights = jax.random.normal(jax.random.PRNGKey(2), (*tok.shape, config.hidden_size))
  acc0 = jax.tree.map(
    lambda p: jax.random.normal(jax.random.PRNGKey(3), p.shape, jnp.float32), params["layers"]
  )

  want_value, want = jax.jit(jax.value_and_grad(loss), static_argnums=1)(
    params, config, tok, attn, weights
  )
  layers = params["layers"]
  rest = {k: v for k, v in params.items() if k != "layers"}

  def fused(rest, acc):
    return loss({**rest, "layers": layers}, config, tok, attn, weights, acc)

  value, (g_rest, acc) = jax.jit(jax.value_and_grad(fused, argnums=(0, 1)))(rest, acc0)
  np.testing.assert_allclose(value, want_value, rtol=1e-6)
  for name in ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"):
    got, ref = np.asarray(acc[name]), np.asarray(acc0[name] + want["layers"][name])
    assert np.abs(np.asarray(want["layers"][name])).max() > 1e-3, name  # a real gradient
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=name)
  for name in rest:
    np.testing.assert_allclose(g_rest[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_layer_grads_needs_full_remat_and_scanned_layers():
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  tok, attn = packed_inputs(0)
  for bad in (dict(remat="none"), dict(scan_layers=False)):
    config = dataclasses.replace(MODEL, **bad)
    with pytest.raises(ValueError, match="full remat"):
      llama.forward(params, config, tok, attn, layer_grads=params["layers"])
  with pytest.raises(ValueError, match="full remat"):
    make_update_fn(dataclasses.replace(MODEL, remat="none"), update_config(), fuse_layer_grads=True)


def _update(fuse, params, batch, cfg, opt):
  state = init_train_state(jax.tree.map(jnp.copy, params), opt)
  fn = make_update_fn(MODEL, cfg, opt, fuse_layer_grads=fuse)
  compiled = fn.lower(state, batch).compile()
  state, met = compiled(state, batch)
  return state, jax.device_get(met), compiled.memory_analysis()


def test_fused_update_equals_plain_and_plans_less_memory():
  """Two mini-batches of two micro-batches (the accumulation the fusion replaces), AdamW."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  batch = jax.tree.map(jnp.asarray, make_batch(0))
  cfg = update_config(
    lr=1e-3, minibatch_size=4, micro_rows=2, vocab_chunk=100, loss=loss_config(low_prob_mask=False)
  )
  opt = optax.adamw(1e-3)
  plain, met_plain, mem_plain = _update(False, params, batch, cfg, opt)
  fused, met_fused, mem_fused = _update(True, params, batch, cfg, opt)
  assert int(met_fused["optim_steps"]) == 2
  moved = max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(*map(jax.tree.leaves, (plain.params, params)))
  )
  assert moved > 1e-4
  for a, b in zip(jax.tree.leaves(fused.params), jax.tree.leaves(plain.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for k in ("loss", "pg_loss", "grad_norm", "update_norm", "entropy"):
    np.testing.assert_allclose(met_fused[k], met_plain[k], rtol=1e-5, err_msg=k)
  if mem_plain is not None and mem_fused is not None:
    layer_bytes = sum(x.nbytes for x in jax.tree.leaves(params["layers"]))
    # the plain program holds a micro-batch's whole layer gradient beside the accumulator;
    # the saving measured: 0.48 x the layers here, 0.53 x for SmolLM2 (bench/host_memory.py)
    assert mem_fused.temp_size_in_bytes <= mem_plain.temp_size_in_bytes - 0.4 * layer_bytes, (
      mem_fused.temp_size_in_bytes,
      mem_plain.temp_size_in_bytes,
      layer_bytes,
    )
