"""The CPU kernels (model/cpu_kernels.cc, cpu_attention.cc) against numpy float64, and the cached
forward with them against the same forward on XLA's products; where the build fails, the
fallback to XLA's path (always run: it forces a failing build in a fresh process)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.model import cpu_kernels, kv_cache, llama
from empo2_jax.model.configs import LlamaConfig

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
needs_kernels = pytest.mark.skipif(
  jax.default_backend() != "cpu" or not cpu_kernels.available(),
  reason=f"CPU decode kernels unavailable: {cpu_kernels.build_error()}",
)


def reference_attention(q, k_all, v_all, layer, rows, last, mask):
  q, k_all, v_all = (np.asarray(a, np.float64) for a in (q, k_all, v_all))
  out = np.zeros(q.shape)
  for i in range(q.shape[0]):
    seen = (np.arange(k_all.shape[3]) <= last[i]) & (np.asarray(mask)[i] > 0)
    if not seen.any():
      continue
    k, v = k_all[layer, rows[i]][:, seen], v_all[layer, rows[i]][:, seen]  # [Kh, n, hd]
    sc = np.einsum("kgd,knd->kgn", q[i], k) / np.sqrt(q.shape[-1])
    p = np.exp(sc - sc.max(-1, keepdims=True))
    out[i] = np.einsum("kgn,knd->kgd", p / p.sum(-1, keepdims=True), v)
  return out


@needs_kernels
@pytest.mark.parametrize("m", [1, 3, 8, 13])
@pytest.mark.parametrize("k,n", [(64, 200), (72, 37), (20, 5)])
def test_rows_matmul_matches_numpy(m, k, n):
  rng = np.random.default_rng(m * 1000 + k + n)
  x = rng.standard_normal((m, k)).astype(np.float32)
  w = rng.standard_normal((k, n)).astype(np.float32)
  want = x.astype(np.float64) @ w
  got_t = jax.jit(cpu_kernels.rows_matmul)(x, w.T.copy())
  np.testing.assert_allclose(np.asarray(got_t), want, rtol=1e-5, atol=1e-4)
  # the same product as products() over w split in two along N (one call over the joint copy)
  parts = [w[:, : n // 2], w[:, n // 2 :]]
  got_p = jax.jit(cpu_kernels.products)(x[:, None], parts, w.T.copy())  # [M, 1, K] rows
  assert [p.shape for p in got_p] == [(m, 1, n // 2), (m, 1, n - n // 2)]
  np.testing.assert_allclose(np.concatenate(got_p, -1)[:, 0], want, rtol=1e-5, atol=1e-4)


def test_products_checks_the_joint_copy():
  x = np.ones((2, 8), np.float32)
  with pytest.raises(ValueError, match="need"):
    cpu_kernels.products(x, [np.ones((8, 3), np.float32)], np.ones((4, 8), np.float32))


@needs_kernels
@pytest.mark.parametrize("hd", [64, 128, 12])  # vector paths (8 or 16 vectors), scalar path
def test_cached_attention_matches_numpy(hd):
  rng = np.random.default_rng(hd)
  layers, cache_rows, kvh, slots, g = 3, 5, 2, 300, 3
  k_all = rng.standard_normal((layers, cache_rows, kvh, slots, hd)).astype(np.float32)
  v_all = rng.standard_normal((layers, cache_rows, kvh, slots, hd)).astype(np.float32)
  q = rng.standard_normal((5, kvh, g, hd)).astype(np.float32)
  rows = np.array([4, 0, 2, 1, 3], np.int32)
  last = np.array([10, 299, 0, 150, 7], np.int32)  # slot 0 alone; the last slot
  mask = (rng.random((5, slots)) > 0.2).astype(np.int32)
  mask[2, 0] = 0  # row 2 sees no slot: zeros
  q *= 3.0  # peaked softmaxes: exp's range reduction and underflow are exercised
  got = jax.jit(cpu_kernels.cached_attention)(q, k_all, v_all, 1, rows, last, mask)
  want = reference_attention(q, k_all, v_all, 1, rows, last, mask)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  assert not np.asarray(got)[2].any()


@needs_kernels
def test_use_kernels_modes():
  assert not cpu_kernels.use_kernels("xla", jnp.float32)
  assert cpu_kernels.use_kernels("auto", jnp.float32)
  assert not cpu_kernels.use_kernels("auto", jnp.bfloat16)
  with pytest.raises(ValueError, match="float32 on the CPU backend"):
    cpu_kernels.use_kernels("cpu", jnp.bfloat16)
  with pytest.raises(ValueError, match="valid"):
    LlamaConfig(
      vocab_size=8,
      hidden_size=8,
      intermediate_size=8,
      num_layers=1,
      num_heads=1,
      num_kv_heads=1,
      head_dim=8,
      decode_kernels="gpu",
    )


@needs_kernels
@pytest.mark.parametrize("tied", [True, False])
def test_decode_step_with_kernels_matches_xla(tied):
  """One cached decode step (after a prefill) with the kernels and transposed weights gives
  XLA's logits and cache."""
  base = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=8,
    tie_word_embeddings=tied,
    cache_block=16,
  )
  cfg_x = LlamaConfig(**base, decode_kernels="xla")
  cfg_k = LlamaConfig(**base, decode_kernels="cpu")
  params = llama.init_params(cfg_x, jax.random.key(0), std=0.2)
  rng = np.random.default_rng(1)
  b, t = 3, 21
  tokens = jnp.asarray(rng.integers(0, 97, (b, t)), jnp.int32)
  mask = jnp.asarray(np.arange(t)[None] < np.array([[21], [9], [15]]), jnp.int32)
  cache = kv_cache.init_cache(cfg_x, b, 64, jnp.float32)
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  _, cache = llama.forward(
    params, cfg_x, tokens, mask, positions=pos, cache=cache, cache_index=jnp.zeros(b, jnp.int32)
  )
  length = mask.sum(1).astype(jnp.int32)
  nxt = jnp.asarray(rng.integers(0, 97, (b, 1)), jnp.int32)

  def step(p, cfg):
    return llama.forward(
      p,
      cfg,
      nxt,
      jnp.ones((b, 1), jnp.int32),
      positions=length[:, None],
      cache=cache,
      cache_index=length,
    )

  want, cache_x = jax.jit(step, static_argnums=1)(params, cfg_x)
  prepared = llama.with_transposed(llama.split_layers(params), cfg_k)
  got, cache_k = jax.jit(step, static_argnums=1)(prepared, cfg_k)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(cache_k["k"]), np.asarray(cache_x["k"]), atol=1e-5)
  text = jax.jit(step, static_argnums=1).lower(prepared, cfg_k).as_text()
  assert "empo2_cached_attention" in text and "empo2_rows_matmul_nt" in text


@needs_kernels
@pytest.mark.parametrize("hd", [64, 128])
def test_prefill_attention_matches_numpy(hd):
  """Queries of several tokens a row (tiles of 8 tokens, one cut short), each seeing its own
  causal prefix of the cache under the row's mask."""
  rng = np.random.default_rng(hd + 1)
  layers, cache_rows, kvh, slots, g, b, t = 2, 4, 2, 200, 3, 3, 11
  k_all = rng.standard_normal((layers, cache_rows, kvh, slots, hd)).astype(np.float32)
  v_all = rng.standard_normal((layers, cache_rows, kvh, slots, hd)).astype(np.float32)
  q = 3.0 * rng.standard_normal((b, t, kvh, g, hd)).astype(np.float32)
  rows = np.array([3, 0, 1], np.int32)
  slots_bt = np.array([150, 0, 60])[:, None] + np.arange(t)[None, :]  # row 1 starts at slot 0
  slots_bt[2, :3] = -1  # queries that see no slot: zeros
  slots_bt[0, -1] = 400  # past the cache's end: sees every slot
  mask = (rng.random((b, slots)) > 0.2).astype(np.int32)
  mask[1, 0] = 0  # row 1's first query sees nothing either
  got = np.asarray(
    jax.jit(cpu_kernels.prefill_attention)(
      q, k_all, v_all, 1, rows, slots_bt.astype(np.int32), mask
    )
  )
  for i in range(t):  # each token: the one-query reference
    want = reference_attention(q[:, i], k_all, v_all, 1, rows, slots_bt[:, i], mask)
    np.testing.assert_allclose(got[:, i], want, rtol=1e-5, atol=1e-6)
  assert not got[2, :3].any() and not got[1, 0].any()


@needs_kernels
def test_prefill_with_kernels_matches_xla():
  """A cached prefill in two chunks (the second attends over the first's slots) with the kernels
  gives XLA's logits and cache."""
  base = dict(
    vocab_size=97,
    hidden_size=128,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    cache_block=16,
  )
  cfg_x, cfg_k = (LlamaConfig(**base, decode_kernels=m) for m in ("xla", "cpu"))
  params = llama.init_params(cfg_x, jax.random.key(3), std=0.2)
  rng = np.random.default_rng(4)
  b, t = 3, 19
  tokens = jnp.asarray(rng.integers(0, 97, (b, 2 * t)), jnp.int32)
  mask = jnp.asarray(np.arange(2 * t)[None] >= np.array([[0], [5], [23]]), jnp.int32)  # left pads

  def prefill(cfg):
    cache = kv_cache.init_cache(cfg, b, 64, jnp.float32)
    index, outs = jnp.zeros(b, jnp.int32), []
    pos = llama.positions_from_mask(mask)
    for a in (0, t):
      out, cache = llama.forward(
        params,
        cfg,
        tokens[:, a : a + t],
        mask[:, a : a + t],
        positions=pos[:, a : a + t],
        cache=cache,
        cache_index=index,
      )
      index, outs = index + t, outs + [out]
    return jnp.concatenate(outs, 1), cache

  want, cache_x = jax.jit(prefill, static_argnums=0)(cfg_x)
  got, cache_k = jax.jit(prefill, static_argnums=0)(cfg_k)
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(cache_k["v"]), np.asarray(cache_x["v"]), atol=1e-5)
  text = jax.jit(prefill, static_argnums=0).lower(cfg_k).as_text()
  assert "empo2_prefill_attention" in text


@needs_kernels
def test_attention_kernels_name_a_bad_argument():
  cache = np.zeros((2, 3, 1, 16, 64), np.float32)  # [L, B', Kh, S, hd]
  mask = np.ones((2, 16), np.int32)
  rows = np.array([0, 3], np.int32)  # the cache has rows 0..2
  with pytest.raises(Exception, match="empo2_cached_attention: a row index is out of range"):
    q = np.ones((2, 1, 2, 64), np.float32)
    jax.block_until_ready(cpu_kernels.cached_attention(q, cache, cache, 0, rows, [1, 1], mask))
  with pytest.raises(Exception, match="empo2_prefill_attention: the layer index is out of range"):
    q = np.ones((2, 4, 1, 2, 64), np.float32)
    slots = np.zeros((2, 4), np.int32)
    jax.block_until_ready(
      cpu_kernels.prefill_attention(q, cache, cache, 2, rows[:1].repeat(2), slots, mask)
    )


@needs_kernels
@pytest.mark.parametrize("hd", [8, 64])  # the scalar and vector attention; 64 also prefill's kernel
def test_a_nan_weight_gives_nan_where_xla_does(hd):
  """A NaN in one key weight of the last layer: every score of that KV head is NaN, so XLA's
  softmax, and the logits after it, are NaN; the kernels (prefill and decode step) give NaN at
  the same places instead of hiding it."""
  base = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=hd,
    cache_block=16,
  )
  cfg_x, cfg_k = (LlamaConfig(**base, decode_kernels=m) for m in ("xla", "cpu"))
  params = llama.init_params(cfg_x, jax.random.key(5), std=0.2)
  params["layers"]["wk"] = params["layers"]["wk"].at[1, 3, 0].set(jnp.nan)
  rng = np.random.default_rng(6)
  b, t = 2, 9
  tokens = jnp.asarray(rng.integers(0, 97, (b, t)), jnp.int32)
  mask = jnp.asarray(np.arange(t)[None] >= np.array([[0], [4]]), jnp.int32)  # row 1 left-padded
  nxt = jnp.asarray(rng.integers(0, 97, (b, 1)), jnp.int32)

  def run(p, cfg):
    cache = kv_cache.init_cache(cfg, b, 32, jnp.float32)
    pos = llama.positions_from_mask(mask)
    first, cache = llama.forward(
      p, cfg, tokens, mask, positions=pos, cache=cache, cache_index=jnp.zeros(b, jnp.int32)
    )
    step, _ = llama.forward(
      p,
      cfg,
      nxt,
      jnp.ones((b, 1), jnp.int32),
      positions=pos[:, -1:] + 1,
      cache=cache,
      cache_index=jnp.full(b, t, jnp.int32),
    )
    return first, step

  want = [np.asarray(a) for a in jax.jit(run, static_argnums=1)(params, cfg_x)]
  prepared = llama.with_transposed(llama.split_layers(params), cfg_k)
  got = [np.asarray(a) for a in jax.jit(run, static_argnums=1)(prepared, cfg_k)]
  real = np.asarray(mask, bool)
  assert np.isnan(want[1]).all() and np.isnan(want[0][real]).all()
  np.testing.assert_array_equal(np.isnan(got[0][real]), np.isnan(want[0][real]))
  np.testing.assert_array_equal(np.isnan(got[1]), np.isnan(want[1]))


def _fallback_run(tmp_path, *args) -> dict:
  """tests/helpers/kernel_fallback_worker.py in a fresh process whose compiler always fails (a
  script that logs each call and exits 1) and whose kernel cache is tmp_path/cache."""
  cxx = tmp_path / "failing_cxx"
  if not cxx.exists():  # the same compiler file each run (a changed one is tried again)
    cxx.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'calls.log'}\nexit 1\n")
    cxx.chmod(0o755)
  env = dict(os.environ, CXX=str(cxx), EMPO2_KERNEL_CACHE=str(tmp_path / "cache"))
  env["JAX_PLATFORMS"] = "cpu"
  done = subprocess.run(
    [sys.executable, os.path.join(HELPERS, "kernel_fallback_worker.py"), *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  out["warnings"] = [ln for ln in done.stderr.splitlines() if "decode kernels" in ln]
  return out


def test_a_failed_build_falls_back_to_xla_and_is_remembered(tmp_path):
  """Where the build fails (no compiler, no AVX2): "auto" samples XLA's tokens, "cpu" is a
  one-line error that says what to do, the failure is reported once in one line, and the next
  process does not compile again."""
  first = _fallback_run(tmp_path, "--sample")
  assert first["available"] is False and "exited with status 1" in first["build_error"]
  assert first["auto_tokens"] == first["xla_tokens"] and first["auto_tokens"]
  assert "\n" not in first["cpu_error"] and "model.decode_kernels" in first["cpu_error"]
  assert len(first["warnings"]) == 1 and "install g++" in first["warnings"][0]
  assert list((tmp_path / "cache").glob("*.failed")) and not list((tmp_path / "cache").glob("*.so"))
  second = _fallback_run(tmp_path)
  assert second["available"] is False and "remembered" in second["build_error"]
  assert (tmp_path / "calls.log").read_text().count("called") == 1  # compiled once, not twice


def test_the_cache_key_names_the_host_cpu(monkeypatch, tmp_path):
  """A library built on one CPU is never loaded on another: the key covers the CPU's model and
  flags."""
  monkeypatch.setenv("EMPO2_KERNEL_CACHE", str(tmp_path))
  here = cpu_kernels._library_path("g++")
  monkeypatch.setattr(cpu_kernels, "host_cpu", lambda: "x86_64\nflags: avx sse")
  other = cpu_kernels._library_path("g++")
  assert here.parent == other.parent == tmp_path and here != other
