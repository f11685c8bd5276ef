"""LoRA adapters (model/lora.py) against the base model, the merged one and peft + transformers."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.model import hf, kv_cache, llama, lora
from tests.conftest import hf_logits, make_hf_checkpoint, random_batch
from tests.helpers.tiny_model import TINY


def _with_random_b(params, config, seed=0, std=0.05):
  """Adapters whose B is not zero (a fresh adapter's is), so the delta shows in the output."""
  params = lora.with_adapters(params, config, jax.random.key(seed))
  rng = np.random.default_rng(seed)
  layers = {
    k: (jnp.asarray(rng.normal(0, std, v.shape), jnp.float32) if k.endswith("_lora_b") else v)
    for k, v in params["layers"].items()
  }
  return dict(params, layers=layers)


def test_fresh_adapters_leave_the_forward_unchanged():
  config = TINY.replace(lora_rank=8, lora_alpha=16.0)
  base = llama.init_params(TINY, jax.random.key(0))
  params = lora.with_adapters(base, config, jax.random.key(1))
  assert {k for k in params["layers"] if lora.is_adapter(k)} == {
    f"{w}_lora_{ab}" for w in lora.TARGETS.values() for ab in "ab"
  }
  assert params["layers"]["wq_lora_a"].shape == (2, 64, 8)
  assert params["layers"]["w_down_lora_b"].shape == (2, 8, 64)
  assert all(v.dtype == jnp.float32 for k, v in params["layers"].items() if lora.is_adapter(k))
  tokens, mask = random_batch(np.random.default_rng(0), 2, 11, TINY.vocab_size, left_pad=[(1, 3)])
  np.testing.assert_array_equal(
    np.asarray(llama.forward(params, config, tokens, mask)),
    np.asarray(llama.forward(base, TINY, tokens, mask)),
  )


def test_merged_equals_unmerged_and_differs_from_base():
  config = TINY.replace(lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj,down_proj")
  base = llama.init_params(TINY, jax.random.key(0))
  params = _with_random_b(base, config)
  merged = lora.merge(params, config)
  assert set(merged["layers"]) == set(base["layers"])
  tokens, mask = random_batch(np.random.default_rng(1), 3, 13, TINY.vocab_size, right_pad=[(2, 4)])
  ours = np.asarray(llama.forward(params, config, tokens, mask))
  np.testing.assert_allclose(
    np.asarray(llama.forward(merged, config, tokens, mask)), ours, atol=1e-5, rtol=0
  )
  # an independent check of the merge: W + (alpha / r) A @ B in numpy float64
  a = np.asarray(params["layers"]["wv_lora_a"], np.float64)
  b = np.asarray(params["layers"]["wv_lora_b"], np.float64)
  want = np.asarray(base["layers"]["wv"], np.float64) + 2.0 * np.einsum("lir,lro->lio", a, b)
  np.testing.assert_allclose(np.asarray(merged["layers"]["wv"]), want, atol=1e-6)
  assert np.abs(ours - np.asarray(llama.forward(base, TINY, tokens, mask))).max() > 1e-3


def test_cached_forward_with_adapters_matches_the_full_forward():
  """The sampler's cached forward (prefill, then one token at a time) applies the adapters."""
  config = TINY.replace(lora_rank=4)
  params = _with_random_b(llama.init_params(TINY, jax.random.key(2)), config, seed=3)
  tokens, mask = random_batch(np.random.default_rng(2), 2, 9, TINY.vocab_size)
  full = np.asarray(llama.forward(params, config, tokens, mask))
  cache = kv_cache.init_cache(config, 2, 16, jnp.float32)
  pos = llama.positions_from_mask(mask)
  index = jnp.zeros((2,), jnp.int32)
  out, cache = llama.forward(
    params, config, tokens[:, :6], mask[:, :6], positions=pos[:, :6], cache=cache, cache_index=index
  )
  steps = [np.asarray(out)]
  for t in range(6, 9):
    out, cache = llama.forward(
      params, config, tokens[:, t : t + 1], mask[:, t : t + 1], positions=pos[:, t : t + 1],
      cache=cache, cache_index=index + t,
    )  # fmt: skip
    steps.append(np.asarray(out))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5, rtol=0)


def test_unknown_target_names_the_valid_ones():
  with pytest.raises(ValueError) as e:
    TINY.replace(lora_rank=8, lora_targets="q_proj,qkv_proj")
  msg = str(e.value)
  assert "\n" not in msg and "qkv_proj" in msg
  assert all(t in msg for t in lora.TARGETS) and lora.ALL_LINEAR in msg
  assert TINY.replace(lora_targets="all-linear").lora_targets == tuple(lora.TARGETS)
  with pytest.raises(ValueError, match="rank >= 0"):
    TINY.replace(lora_rank=-1)


def test_split_join_and_trainable():
  config = TINY.replace(lora_rank=2, lora_targets="o_proj")
  base = llama.init_params(TINY, jax.random.key(0))
  params = lora.with_adapters(base, config, jax.random.key(1))
  adapters, rest = lora.split(params)
  assert set(adapters["layers"]) == {"wo_lora_a", "wo_lora_b"}
  assert jax.tree.structure(rest) == jax.tree.structure(base)
  assert jax.tree.structure(lora.join(adapters, rest)) == jax.tree.structure(params)
  assert lora.trainable(params) == (adapters, rest)
  assert lora.trainable(base) == (base, {})


def test_fingerprint_tells_one_changed_weight():
  base = llama.init_params(TINY.replace(param_dtype="bfloat16"), jax.random.key(0))
  same = jax.tree.map(jnp.copy, base)
  assert lora.fingerprint(base) == lora.fingerprint(same)
  changed = dict(base, layers=dict(base["layers"]))
  w = changed["layers"]["w_up"]
  changed["layers"]["w_up"] = w.at[1, 5, 7].set(w[1, 5, 7] + 1)
  assert lora.fingerprint(changed) != lora.fingerprint(base)
  swapped = dict(base, layers=dict(base["layers"], w_up=w[::-1]))  # the same bits, reordered
  assert lora.fingerprint(swapped) != lora.fingerprint(base)


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_adapters_match_peft_on_transformers(tmp_path, targets):
  """Our forward with adapters == transformers' Qwen2 with peft's LoRA loaded from the files we
  write (peft's names, [r, in] / [out, r] layout, alpha / r scaling)."""
  from peft import PeftModel

  model = make_hf_checkpoint(str(tmp_path / "base"), tie=False)
  config, base = hf.load_checkpoint(str(tmp_path / "base"), dtype="float32")
  config = config.replace(lora_rank=4, lora_alpha=12.0, lora_targets=targets)
  params = _with_random_b(jax.tree.map(jnp.asarray, base), config, seed=5)
  hf.save_lora_adapters(str(tmp_path / "adapter"), config, params)
  peft_model = PeftModel.from_pretrained(model, str(tmp_path / "adapter")).eval()
  tokens, mask = random_batch(np.random.default_rng(3), 2, 15, config.vocab_size, left_pad=[(1, 4)])
  ref = hf_logits(peft_model, tokens, mask)
  ours = np.asarray(llama.forward(params, config, tokens, mask))
  valid = mask.astype(bool)
  assert np.abs(ours[valid] - ref[valid]).max() <= 1e-4
  assert np.abs(ours[valid] - hf_logits(peft_model.get_base_model(), tokens, mask)[valid]).max()


def test_merged_checkpoint_loads_in_transformers(tmp_path):
  """hf.save_checkpoint of a tree with adapters writes the merged model."""
  from transformers import AutoModelForCausalLM

  config = TINY.replace(lora_rank=4, lora_targets=("gate_proj",))
  params = _with_random_b(llama.init_params(TINY, jax.random.key(4)), config, seed=6)
  hf.save_checkpoint(str(tmp_path), config, jax.device_get(params))
  model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype="float32").eval()
  tokens, mask = random_batch(np.random.default_rng(4), 2, 10, TINY.vocab_size)
  ours = np.asarray(llama.forward(params, config, tokens, mask))
  assert np.abs(ours - hf_logits(model, tokens, mask)).max() <= 1e-4
