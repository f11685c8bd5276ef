"""One-shot sampler: HF greedy parity, the sampling distribution, top-k/top-p sets, compile
bound."""

import numpy as np
import pytest
import torch

import jax
import jax.numpy as jnp

from empo2_jax.model import hf, llama
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.sampling import kernels
from empo2_jax.sampling.sampler import (
  Engine,
  SamplerSettings,
  chunk_plan,
  generate,
  get_engine,
)
from tests.conftest import make_hf_checkpoint

FP32 = SamplerSettings(cache_dtype="float32", prefill_chunks=(16, 64))


def peaked_hf_checkpoint(path, scale=4.0, **kw):
  """A random HF model whose weights are scaled up so that next-token distributions are peaked
  (default init gives near-uniform logits, where greedy near-ties would make parity fragile)."""
  model = make_hf_checkpoint(path, **kw)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" not in name and not name.endswith("bias"):
        p.mul_(scale)
  model.save_pretrained(path, safe_serialization=True)
  return model


def tiny_config(vocab, **kw):
  base = dict(
    vocab_size=vocab,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=10000.0,
  )
  base.update(kw)
  return LlamaConfig(**base)


def hf_greedy(model, prompt, max_new, stop):
  ids = torch.tensor([prompt], dtype=torch.long)
  with torch.no_grad():
    out = model.generate(
      ids,
      attention_mask=torch.ones_like(ids),
      do_sample=False,
      max_new_tokens=max_new,
      eos_token_id=stop,
      pad_token_id=stop,
    )
  return out[0, len(prompt) :].tolist()


def test_chunk_plan():
  assert chunk_plan(0, (16, 64)) == []
  assert chunk_plan(5, (16, 64)) == [16]
  assert chunk_plan(17, (16, 64)) == [16, 16]  # 32 tokens computed, not 64
  assert chunk_plan(40, (16, 64)) == [64]  # 16 + 64 would compute more
  assert chunk_plan(150, (16, 64)) == [64, 64, 16, 16]
  assert chunk_plan(129, (16, 64)) == [64, 64, 16]
  default = SamplerSettings().prefill_chunks
  assert chunk_plan(180, default) == [128, 64] and chunk_plan(1050, default) == [1024, 32]
  for n in range(1, 3000):  # covers n; never more padding than the one-bucket plan
    plan = chunk_plan(n, default)
    assert sum(plan) >= n and sum(plan) - sum(plan[:-1]) > 0 and sum(plan[:-1]) < n
    rest = n - (n // 1024) * 1024
    one = (n // 1024) * 1024 + (min(c for c in default if c >= rest) if rest else 0)
    assert sum(plan) <= one, n


def test_chunks_for_keeps_rows_times_length_within_the_token_budget():
  st = SamplerSettings(prefill_tokens=1024)
  assert st.chunks_for(8) == (16, 32, 64, 128)
  assert st.chunks_for(1) == st.prefill_chunks and st.chunks_for(64) == (16,)
  assert st.chunks_for(256) == (16,)  # over budget even at the smallest: that one still runs
  assert SamplerSettings().chunks_for(8, backend="cpu") == (16, 32, 64, 128)
  assert SamplerSettings().chunks_for(8, backend="tpu") == SamplerSettings().prefill_chunks
  with pytest.raises(ValueError, match="prefill_tokens"):
    SamplerSettings(prefill_tokens=0)


def test_prefill_chunks_follow_the_budget_and_give_the_same_logits():
  # 3 rows of 40 tokens: a budget of 48 tokens allows only 16-token chunks (3 calls), the default
  # one 64-token chunk; the hidden states (hence every later logit) agree.
  config = tiny_config(256, param_dtype="float32", compute_dtype="float32")
  params = llama.init_params(config, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  suffixes = [rng.integers(0, config.vocab_size, 40).tolist() for _ in range(3)]
  out = {}
  for budget in (48, None):
    st = SamplerSettings(cache_dtype="float32", prefill_chunks=(16, 64), prefill_tokens=budget)
    eng = Engine(config, st)
    cache, hidden = eng.new_cache(3, 256), eng.new_hidden(3)
    cache, hidden, computed = eng.prefill(params, cache, hidden, suffixes, np.zeros(3, np.int64))
    out[budget] = (np.asarray(hidden), computed, eng.traces["prefill"])
  assert out[48][1] == 3 * 48 and out[48][2] == 1
  assert out[None][1] == 3 * 64 and out[None][2] == 1
  np.testing.assert_allclose(out[48][0], out[None][0], rtol=2e-5, atol=2e-5)


def test_greedy_matches_hf_generate(tmp_path):
  model = peaked_hf_checkpoint(str(tmp_path), vocab=256, hidden=64, inter=96, heads=4, kv_heads=2)
  config, params = hf.load_checkpoint(str(tmp_path), dtype="float32")
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 256, n).tolist() for n in (1, 5, 150, 23, 300, 64)]
  max_new = 20
  free = generate(
    params,
    config,
    prompts,
    max_new_tokens=max_new,
    temperature=0.0,
    rng=jax.random.key(0),
    settings=FP32,
  )
  assert all(len(t) == max_new for t, _ in free)
  stop = int(free[2][0][6])  # a token that row 2 emits at step 6: rows must stop on it
  out = generate(
    params,
    config,
    prompts,
    max_new_tokens=max_new,
    temperature=0.0,
    stop_ids=[stop],
    rng=jax.random.key(0),
    settings=FP32,
  )
  lengths = []
  for p, (toks, lps) in zip(prompts, out):
    assert toks.tolist() == hf_greedy(model, p, max_new, stop)
    assert lps.shape == toks.shape and np.all(lps <= 0)
    lengths.append(len(toks))
  assert lengths[2] <= 7 and out[2][0][-1] == stop and len(set(lengths)) > 1


def test_bf16_cache_close_to_fp32(tmp_path):
  make_hf_checkpoint(str(tmp_path), vocab=256, hidden=64, inter=96)
  config, params = hf.load_checkpoint(str(tmp_path), dtype="float32")
  prompts = [np.random.default_rng(1).integers(0, 256, 40).tolist()]
  ((t32, l32),) = generate(
    params, config, prompts, max_new_tokens=1, temperature=1.0, rng=jax.random.key(3), settings=FP32
  )
  bf16 = SamplerSettings(prefill_chunks=(16, 64))
  assert bf16.cache_dtype == "bfloat16"
  ((t16, l16),) = generate(
    params, config, prompts, max_new_tokens=1, temperature=1.0, rng=jax.random.key(3), settings=bf16
  )
  assert get_engine(config, bf16).settings.cache_dtype == "bfloat16"
  assert t16[0] == t32[0] and abs(float(l16[0] - l32[0])) < 0.05


def _tv(p, q):
  return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


@pytest.mark.slow
def test_temperature_sampling_follows_softmax():
  config = tiny_config(8)
  params = llama.init_params(config, jax.random.key(0), std=0.6)
  prompt = [1, 5, 2, 7]
  logits = np.asarray(
    llama.forward(params, config, jnp.asarray([prompt]), jnp.ones((1, 4), jnp.int32))
  )[0, -1]
  settings = SamplerSettings(
    cache_dtype="float32", prefill_chunks=(8,), cache_lengths=(32,), batch_sizes=(2048,)
  )
  n, refs = 2048, {}
  for temp in (0.5, 2.0):
    ref = np.asarray(jax.nn.softmax(logits / temp))
    refs[temp] = ref
    out = generate(
      params,
      config,
      [prompt] * n,
      max_new_tokens=1,
      temperature=temp,
      rng=jax.random.key(7),
      settings=settings,
    )
    toks = np.array([t[0] for t, _ in out])
    freq = np.bincount(toks, minlength=8) / n
    assert _tv(freq, ref) < 0.04, (temp, freq, ref)
    lps = np.array([lp[0] for _, lp in out])
    # The cached forward's logits differ from the plain one's by f32 rounding (its size depends on
    # the CPU's vector width), scaled by 1/temperature: a rare token's log-prob (~-6.7) has been
    # off by 1.1e-5 on one CPU. A wrong temperature would be off by far more.
    np.testing.assert_allclose(lps, np.log(ref[toks]), rtol=1e-5, atol=1e-5)
  assert _tv(refs[0.5], refs[2.0]) > 0.1  # the temperature visibly changes the target


def allowed_set(logits_v, top_k, top_p):
  order = np.argsort(-logits_v, kind="stable")
  keep = np.ones(len(order), bool) if top_k <= 0 else np.arange(len(order)) < top_k
  xs = np.where(keep, logits_v[order], -np.inf)
  p = np.exp(xs - xs.max())
  p /= p.sum()
  before = np.cumsum(p) - p
  keep &= (before < top_p) | (np.arange(len(order)) == 0)
  probs = np.zeros(len(order))
  probs[order[keep]] = p[keep] / p[keep].sum()
  return set(order[keep].tolist()), probs


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.5), (5, 0.7), (1, 1.0), (0, 0.05)])
def test_top_k_top_p_stay_in_allowed_set(top_k, top_p):
  b, v = 8, 64
  logits = np.asarray(jax.random.normal(jax.random.key(1), (b, v))) * 2.0
  draws = 300
  choose = jax.jit(
    jax.vmap(
      lambda k: kernels.choose(
        jnp.asarray(logits), jax.random.split(k, b), 0, 1.0, top_p, top_k, "filter"
      )
    )
  )
  toks, lps = map(np.asarray, choose(jax.random.split(jax.random.key(2), draws)))  # [draws, b]
  for r in range(b):
    allowed, probs = allowed_set(logits[r], top_k, top_p)
    seen = set(toks[:, r].tolist())
    assert seen <= allowed, (r, seen - allowed)
    np.testing.assert_allclose(lps[:, r], np.log(probs[toks[:, r]]), atol=1e-5)
    if len(allowed) <= 3:
      assert seen == allowed  # not over-restrictive either


def test_generate_top_k_end_to_end():
  config = tiny_config(16)
  params = llama.init_params(config, jax.random.key(4), std=0.5)
  prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [5]]
  out = generate(
    params,
    config,
    prompts,
    max_new_tokens=6,
    temperature=1.3,
    top_k=2,
    rng=jax.random.key(5),
    settings=FP32,
  )
  for p, (toks, lps) in zip(prompts, out):
    seq = p + toks.tolist()
    logits = np.asarray(
      jax.jit(llama.forward, static_argnums=1)(
        params, config, jnp.asarray([seq]), jnp.ones((1, len(seq)), jnp.int32)
      )
    )[0]
    for i, t in enumerate(toks):
      allowed, probs = allowed_set(logits[len(p) - 1 + i] / 1.3, 2, 1.0)
      assert int(t) in allowed
      np.testing.assert_allclose(lps[i], np.log(probs[t]), atol=1e-5)


@pytest.mark.slow
def test_compile_count_bounded():
  config = tiny_config(64)
  params = llama.init_params(config, jax.random.key(0), std=0.3)
  settings = SamplerSettings(
    cache_dtype="float32",
    prefill_chunks=(16, 64),
    cache_lengths=(128, 256),
    batch_sizes=(4, 8),
    new_token_buckets=(16,),
  )
  engine = get_engine(config, settings)
  rng = np.random.default_rng(0)
  for i in range(50):
    n = int(rng.integers(1, 9))
    prompts = [rng.integers(0, 64, int(rng.integers(1, 150))).tolist() for _ in range(n)]
    out = generate(
      params,
      config,
      prompts,
      max_new_tokens=int(rng.integers(1, 12)),
      temperature=float(rng.uniform(0.5, 1.5)),
      top_p=1.0,
      top_k=0,
      stop_ids=[int(rng.integers(0, 64))],
      rng=jax.random.key(i),
      settings=settings,
    )
    assert len(out) == n
    if i == 0:  # the counter counts
      assert engine.traces["decode"] == 1
      assert engine.traces["prefill"] + engine.traces["prefill_rows"] >= 1
  # prefill (all rows, whole cache): 2 batch x 2 chunk x 2 cache shapes; prefill_rows (a row
  # subset and/or a cache window): 2 row buckets x 2 chunks x 2 windows x 2 cache shapes at most;
  # decode: 2 batch x 2 cache shapes (one mode)
  assert engine.traces["prefill"] <= 8 and engine.traces["decode"] <= 4, engine.traces
  assert engine.traces["prefill_rows"] <= 16, engine.traces
  assert engine._prefill._cache_size() == engine.traces["prefill"]
  assert engine._prefill_rows._cache_size() == engine.traces["prefill_rows"]
  assert engine._decode._cache_size() == engine.traces["decode"]


def test_host_arrays_enter_the_engine_without_compiling():
  """Host -> device transfers of new shapes compile nothing (jnp.asarray compiled a `stage`
  program per shape, and every compiled program stays resident for the process), and the row
  keys are one program per row count (eager vmap compiled each of its primitives per count)."""
  from empo2_jax.sampling import sampler
  from empo2_jax.train.hoststats import CompileCounter

  engine = get_engine(tiny_config(64), FP32)
  CompileCounter.install()
  rng = jax.random.key(0)
  sampler.row_keys(rng, range(3))  # warm: the shapes below are new
  before, _ = CompileCounter.totals()
  for n in (5, 6, 7):
    x = engine.place_rows(np.arange(n * 3, dtype=np.int64).reshape(n, 3))
    assert x.dtype == jnp.int32 and isinstance(x, jax.Array)
    np.testing.assert_array_equal(np.asarray(x), np.arange(n * 3).reshape(n, 3))
  assert CompileCounter.totals()[0] == before
  keys = [sampler.row_keys(rng, range(n)) for n in (5, 6, 7)]
  assert CompileCounter.totals()[0] == before + 3
  want = [jax.random.fold_in(rng, i) for i in range(7)]
  for i in range(7):
    np.testing.assert_array_equal(jax.random.key_data(keys[2][i]), jax.random.key_data(want[i]))
