"""Our Qwen2 forward against transformers' Qwen2ForCausalLM on random checkpoints."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.model import hf, kv_cache, llama
from tests.conftest import hf_logits, make_hf_checkpoint, random_batch

CASES = {
  "mha_untied": dict(heads=4, kv_heads=4, tie=False),
  "gqa7_tied": dict(hidden=112, heads=14, kv_heads=2, head_dim=8, tie=True),  # 7B's 7:1 ratio
  "gqa_theta": dict(heads=4, kv_heads=2, theta=1_000_000.0, tie=False),
  "gqa_headdim": dict(hidden=64, heads=4, kv_heads=1, head_dim=32, tie=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_logits_match_hf(tmp_path, case):
  model = make_hf_checkpoint(str(tmp_path), **CASES[case])
  config, params = hf.load_checkpoint(str(tmp_path), dtype="float32")
  rng = np.random.default_rng(1)
  # odd length, batch 3: full row, left-padded row, right-padded row
  tokens, mask = random_batch(rng, 3, 37, config.vocab_size, left_pad=[(1, 9)], right_pad=[(2, 5)])
  ref = hf_logits(model, tokens, mask)
  ours = np.asarray(jax.jit(llama.forward, static_argnums=1)(params, config, tokens, mask))
  valid = mask.astype(bool)
  assert np.abs(ours[valid] - ref[valid]).max() <= 1e-4


def test_bf16_compute_kl_small(hf_tiny):
  path, model = hf_tiny
  config, params = hf.load_checkpoint(path, dtype="float32")
  config16 = config.replace(compute_dtype="bfloat16")
  rng = np.random.default_rng(2)
  tokens, mask = random_batch(rng, 2, 33, config.vocab_size, left_pad=[(1, 4)])
  ref = hf_logits(model, tokens, mask)
  ours = np.asarray(llama.forward(params, config16, tokens, mask))
  p = jax.nn.log_softmax(ref, -1)
  q = jax.nn.log_softmax(ours, -1)
  kl = np.asarray(jnp.sum(jnp.exp(p) * (p - q), -1))[mask.astype(bool)]
  assert kl.mean() <= 1e-3


def test_scan_and_loop_and_remat_agree(hf_tiny):
  path, _ = hf_tiny
  config, params = hf.load_checkpoint(path)
  tokens, mask = random_batch(np.random.default_rng(3), 2, 16, config.vocab_size)
  base = llama.forward(params, config, tokens, mask)
  for kw in (dict(scan_layers=False), dict(remat="full"), dict(remat="dots_saveable")):
    other = llama.forward(params, config.replace(**kw), tokens, mask)
    np.testing.assert_allclose(np.asarray(other), np.asarray(base), atol=1e-5)


def test_hidden_states_project_to_logits(hf_tiny):
  path, _ = hf_tiny
  config, params = hf.load_checkpoint(path)
  tokens, mask = random_batch(np.random.default_rng(4), 2, 12, config.vocab_size)
  hidden = llama.forward(params, config, tokens, mask, return_hidden=True)
  logits = llama.forward(params, config, tokens, mask)
  proj = jnp.einsum("btd,dv->btv", hidden, llama.output_embedding(params, config))
  np.testing.assert_allclose(np.asarray(proj), np.asarray(logits), atol=1e-5)


@pytest.mark.parametrize(
  "block,scan", [(256, True), (8, True), (5, True), (5, False)], ids=["one", "8", "5", "5loop"]
)
def test_kv_cache_chunks_match_full_forward(hf_tiny, block, scan):
  """Prefill in two uneven chunks (rows of different lengths) == one full forward, whether the
  cache is read in one block or several (5: 32 slots leave an overlapping last block). With
  several blocks, the slots past the furthest query's block hold NaN: they must never be read."""
  path, _ = hf_tiny
  config, params = hf.load_checkpoint(path)
  rng = np.random.default_rng(5)
  lens = np.array([20, 13])
  tokens = rng.integers(0, config.vocab_size, size=(2, 20)).astype(np.int32)
  full = np.asarray(llama.forward(params, config, tokens, np.ones_like(tokens)))
  config = config.replace(cache_block=block, scan_layers=scan)
  cache = kv_cache.init_cache(config, 2, 32, dtype=jnp.float32)
  if block < 32:  # the furthest query is slot 19: blocks of 5 end at slot 19, blocks of 8 at 23
    far = 20 if block == 5 else 24
    cache = {k: v if k == "mask" else v.at[:, :, :, far:].set(jnp.nan) for k, v in cache.items()}
  index = np.zeros(2, np.int32)
  outs = [[], []]
  for chunk in ([7, 5], [13, 8]):  # tokens per row in each call
    t = max(chunk)
    toks = np.zeros((2, t), np.int32)
    m = np.zeros((2, t), np.int32)
    for b in range(2):
      toks[b, : chunk[b]] = tokens[b, index[b] : index[b] + chunk[b]]
      m[b, : chunk[b]] = 1
    pos = index[:, None] + np.arange(t)[None]
    logits, cache = llama.forward(
      params, config, toks, m, positions=pos, cache=cache, cache_index=index
    )
    for b in range(2):
      outs[b].append(np.asarray(logits[b, : chunk[b]]))
    index = index + np.array(chunk)
  for b in range(2):
    got = np.concatenate(outs[b])
    np.testing.assert_allclose(got, full[b, : lens[b]], atol=1e-4)


def test_bf16_cache_as_bits_equals_a_bf16_cache(hf_tiny):
  """On the CPU backend a bfloat16 cache is stored as uint16 bits (kv_cache.CACHE_BITS): a prefill
  chunk, then decode steps of single tokens, give the same logits bit for bit as the same cache
  stored in bfloat16, and the stored values read back are those bfloat16 values."""
  path, _ = hf_tiny
  config, params = hf.load_checkpoint(path)
  params = jax.device_put(params)
  config = config.replace(cache_block=8)
  tokens = np.random.default_rng(6).integers(0, config.vocab_size, size=(2, 14)).astype(np.int32)
  bits = kv_cache.init_cache(config, 2, 32, dtype=jnp.bfloat16)
  plain = kv_cache.init_cache(config, 2, 32, dtype=jnp.bfloat16, backend="tpu")
  assert bits["k"].dtype == jnp.uint16 and plain["k"].dtype == jnp.bfloat16
  step = jax.jit(
    lambda cache, toks, index: llama.forward(
      params,
      config,
      toks,
      jnp.ones_like(toks),
      positions=index[:, None] + jnp.arange(toks.shape[1])[None],
      cache=cache,
      cache_index=index,
    )
  )
  index = np.zeros(2, np.int32)
  for t in (10, 1, 1, 1, 1):
    toks = tokens[:, index[0] : index[0] + t]
    got, bits = step(bits, toks, index)
    want, plain = step(plain, toks, index)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    index = index + t
  np.testing.assert_array_equal(
    np.asarray(kv_cache.cache_values(bits["v"]), np.float32), np.asarray(plain["v"], np.float32)
  )
  assert float(jnp.abs(plain["v"][:, :, :, :14].astype(jnp.float32)).max()) > 0  # written
