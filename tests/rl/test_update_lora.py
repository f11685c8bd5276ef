"""The update of a LoRA policy (model/lora.py): only the adapters get gradients, optimizer state
and change; the steps equal a plain full-logits reference differentiated over the adapters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from empo2_jax.model import llama, lora
from empo2_jax.rl.update import (
  check_master_dtype,
  init_train_state,
  make_optimizer,
  make_update_fn,
)
from tests.helpers.rl_settings import loss_config, update_config
from tests.helpers.tiny_model import TINY
from tests.rl.test_update import B, make_batch, reference_update

LORA = TINY.replace(lora_rank=4, lora_alpha=8.0)


def _lora_params(config=LORA, seed=0):
  base = llama.init_params(config, jax.random.key(seed))
  params = lora.with_adapters(base, config, jax.random.key(seed + 1))
  # a non-zero B, so the adapters' own gradient (and not only B's) is exercised
  layers = dict(params["layers"])
  for k in layers:
    if k.endswith("_lora_b"):
      layers[k] = 0.02 * jax.random.normal(jax.random.key(hash(k) % 1000), layers[k].shape)
  return dict(params, layers=layers)


@pytest.mark.slow
def test_lora_update_matches_reference_over_the_adapters():
  params = _lora_params()
  adapters, base = lora.split(params)
  batch = make_batch(0)
  cfg = update_config(
    lr=1e-3, minibatch_size=B // 2, micro_rows=2, vocab_chunk=100,
    loss=loss_config(low_prob_delta=-100.0),  # nothing masked (the reference masks by delta)
  )  # fmt: skip
  opt = optax.sgd(0.05)
  want, *_ = reference_update(adapters, batch, cfg, 2, opt, model=LORA, frozen=base)
  state = init_train_state(jax.tree.map(jnp.copy, params), opt)
  state, met = make_update_fn(LORA, cfg, opt)(state, jax.tree.map(jnp.asarray, batch))
  got, got_base = lora.split(state.params)
  moved = max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(*map(jax.tree.leaves, (want, adapters)))
  )
  assert moved > 1e-5
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  for a, b in zip(jax.tree.leaves(got_base), jax.tree.leaves(base)):
    np.testing.assert_array_equal(a, b)  # the base is untouched, bit for bit
  assert int(met["optim_steps"]) == 2


def test_only_adapters_have_optimizer_state_and_change_with_a_bf16_base():
  config = LORA.replace(param_dtype="bfloat16")
  check_master_dtype(config)  # a frozen bf16 base is allowed with LoRA ...
  with pytest.raises(ValueError, match="master"):
    check_master_dtype(TINY.replace(param_dtype="bfloat16"))  # ... not for full fine-tuning
  params = _lora_params(config, seed=3)
  assert (
    params["embed"].dtype == jnp.bfloat16 and params["layers"]["wq_lora_a"].dtype == jnp.float32
  )
  cfg = update_config(lr=1e-2, micro_rows=4, vocab_chunk=128, loss=loss_config(low_prob_mask=False))
  opt = make_optimizer(cfg)
  state = init_train_state(params, opt)
  adapter_leaves = len(jax.tree.leaves(lora.split(params)[0]))
  mu = state.opt_state[1][0].mu  # clip, then AdamW's (ScaleByAdamState, ...): its first moment
  assert jax.tree.structure(mu) == jax.tree.structure(lora.split(params)[0])
  assert len(jax.tree.leaves(mu)) == adapter_leaves
  before = jax.tree.map(np.asarray, params)
  state, met = make_update_fn(config, cfg, opt, donate=False)(
    state, jax.tree.map(jnp.asarray, make_batch(5))
  )
  flat_before = dict(jax.tree_util.tree_flatten_with_path(before)[0])
  changed = {
    jax.tree_util.keystr(p)
    for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]
    if not np.array_equal(np.asarray(x), flat_before[p])
  }
  assert changed and all("_lora_" in k for k in changed)  # A and B of every target move
  assert len(changed) == adapter_leaves
  assert state.params["embed"].dtype == jnp.bfloat16
  assert np.isfinite(float(met["grad_norm"])) and float(met["update_norm"]) > 0


def test_fuse_layer_grads_is_refused_with_lora():
  cfg = update_config(micro_rows=4)
  with pytest.raises(ValueError, match="lora_rank"):
    make_update_fn(LORA.replace(remat="full"), cfg, fuse_layer_grads=True)
