"""Mixed precision (fp32 masters, bf16 compute) and the update's shuffled mini-batch schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from empo2_jax.model import llama
from empo2_jax.rl import minibatch
from empo2_jax.rl.update import (
  init_train_state,
  make_optimizer,
  make_update_fn,
  sample_logprobs_fn,
)
from tests.helpers.rl_settings import loss_config, update_config
from tests.rl.test_update import MODEL, P, R, full_logp, make_batch

BF16_COMPUTE = MODEL.replace(compute_dtype="bfloat16")


def pattern_batch(n, n_patterns=10, seed=0):
  """n on-policy samples drawn from n_patterns (prompt, response) pairs; the first half of the
  patterns have advantage +1, the rest -1. Rows are in the order of build_batch (all real)."""
  base = make_batch(seed, rows=n_patterns)
  base["response_mask"][-1] = base["response_mask"][0]  # every pattern has response tokens
  base["cur_tokens"][-1, P:] = base["cur_tokens"][0, P:]
  base["cur_attn"][-1, P:] = base["cur_attn"][0, P:]
  base["old_tokens"], base["old_attn"] = base["cur_tokens"], base["cur_attn"]
  base["advantages"] = np.where(np.arange(n_patterns) < n_patterns // 2, 1.0, -1.0).astype(
    np.float32
  )
  pick = np.arange(n) % n_patterns
  out = {k: v[pick].copy() for k, v in base.items()}
  out["sample_index"] = np.arange(n, dtype=np.int32)
  return out


def changed_fraction(a, b):
  return float(np.mean(np.asarray(a) != np.asarray(b)))


# --------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------


def test_lr_1e6_step_moves_fp32_masters_but_not_bf16_storage():
  """The default precision learns at the paper's lr; bf16 storage would round every step away."""
  params = llama.init_params(BF16_COMPUTE, jax.random.PRNGKey(0))  # fp32 masters
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  batch = jax.tree.map(jnp.asarray, pattern_batch(16))
  cfg = update_config(lr=1e-6, micro_rows=8, vocab_chunk=128, loss=loss_config(low_prob_mask=False))
  state = init_train_state(jax.tree.map(jnp.copy, params), make_optimizer(cfg))
  assert all(
    x.dtype == jnp.float32
    for x in jax.tree.leaves(state.opt_state)
    if jnp.issubdtype(x.dtype, jnp.floating)
  )  # fp32 AdamW moments
  state, met = make_update_fn(BF16_COMPUTE, cfg)(state, batch)
  assert int(met["optim_steps"]) == 1 and float(met["update_norm"]) > 0
  step = jax.tree.map(lambda a, b: a - b, state.params, params)  # the fp32 update applied
  matrices = [k for k, v in params["layers"].items() if v.ndim == 3]
  for k in matrices:
    assert changed_fraction(state.params["layers"][k], params["layers"][k]) > 0.99, k
    assert float(jnp.max(jnp.abs(step["layers"][k]))) < 3e-6, k  # ~lr per element

  # The same step applied to bf16 storage: all but the weights within ~256 lr of zero round back.
  stored = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  after = optax.apply_updates(stored, step)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(after))
  for k in matrices:
    assert changed_fraction(after["layers"][k], stored["layers"][k]) < 0.03, k

  with pytest.raises(ValueError, match="float32 master"):  # and the update refuses bf16 storage
    make_update_fn(BF16_COMPUTE.replace(param_dtype="bfloat16"), cfg)


def test_fp32_masters_compute_in_bf16_with_fp32_gradients():
  """bf16 compute from fp32 masters is exactly the bf16-weight model (the cast happens per use),
  differs from fp32 compute, and its gradients w.r.t. the masters are fp32."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(1))
  b = make_batch(2)
  tok, attn = jnp.asarray(b["cur_tokens"]), jnp.asarray(b["cur_attn"])
  cfg = update_config(micro_rows=8, vocab_chunk=128)
  mixed = sample_logprobs_fn(BF16_COMPUTE, cfg)(params, tok, attn, R)
  cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  pure_bf16 = sample_logprobs_fn(BF16_COMPUTE.replace(param_dtype="bfloat16"), cfg)(
    cast, tok, attn, R
  )
  fp32 = sample_logprobs_fn(MODEL, cfg)(params, tok, attn, R)
  m = b["response_mask"] > 0
  np.testing.assert_array_equal(np.asarray(mixed)[m], np.asarray(pure_bf16)[m])
  assert float(np.max(np.abs(np.asarray(mixed) - np.asarray(fp32))[m])) > 1e-4

  def loss(p):
    from empo2_jax.rl.logprobs import response_logprobs

    return jnp.sum(response_logprobs(p, BF16_COMPUTE, tok, attn, R, chunk_size=128) * m)

  grads = jax.grad(loss)(params)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
  assert float(optax.global_norm(grads)) > 0


def test_sampler_takes_fp32_masters_with_bf16_compute():
  """Rollouts read the fp32 masters: same tokens and log-probs as the bf16-cast weights."""
  from empo2_jax.sampling.sampler import SamplerSettings, generate

  params = llama.init_params(MODEL, jax.random.PRNGKey(3))
  cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  prompts = [[5, 6, 7, 8], [9, 10, 11]]
  kw = dict(
    max_new_tokens=6,
    temperature=1.0,
    rng=jax.random.PRNGKey(4),
    settings=SamplerSettings(
      cache_dtype="bfloat16",
      prefill_chunks=(16,),
      cache_lengths=(64,),
      batch_sizes=(2,),
      new_token_buckets=(8,),
    ),
  )
  a = generate(params, BF16_COMPUTE, prompts, **kw)
  b = generate(cast, BF16_COMPUTE.replace(param_dtype="bfloat16"), prompts, **kw)
  for (ta, la), (tb, lb) in zip(a, b):
    np.testing.assert_array_equal(ta, tb)
    np.testing.assert_array_equal(la, lb)


# --------------------------------------------------------------------------------------------
# Mini-batch layout
# --------------------------------------------------------------------------------------------


def test_plan_and_layout():
  assert minibatch.plan(300, 128) == (3, 3)
  assert minibatch.plan(128, 128) == (1, 1) and minibatch.plan(129, 128)[0] == 2
  assert minibatch.plan(0, 128) == (0, 1)
  assert minibatch.split_sizes(300, 3) == [100, 100, 100]
  assert minibatch.split_sizes(257, 3) == [86, 86, 85]
  # Bounded compilation: few distinct row counts over the sizes an iteration can have.
  assert len({minibatch.plan(n, 128)[1] for n in range(1, 4001)}) <= 17

  batch = pattern_batch(300)
  batch["sample_index"][-5:] = -1  # build_batch's padding rows are dropped
  cfg = update_config(minibatch_size=128, micro_rows=8)
  out, lay = minibatch.arrange(batch, cfg, seed=(0, 7))
  assert lay == {
    "num_minibatches": 3,
    "slots": 3,
    "rows": 384,
    "slot_rows": 128,
    "sizes": [99, 98, 98],
  }
  assert out["slot_steps"].tolist() == [1, 1, 1]
  idx = out["sample_index"]
  assert sorted(idx[idx >= 0].tolist()) == list(range(295))  # each real sample once
  n_chunks = 384 // 8
  slot = (np.arange(384) % n_chunks) // 16  # update.py's slot of a row
  assert [int(np.sum((idx >= 0) & (slot == k))) for k in range(3)] == [99, 98, 98]
  pad = idx < 0
  assert not out["response_mask"][pad].any() and not out["cur_attn"][pad].any()
  np.testing.assert_array_equal(out["advantages"][~pad], batch["advantages"][idx[~pad]])
  # The shuffle is a function of the seed only: a resumed run lays out the same batch.
  again, _ = minibatch.arrange(batch, cfg, seed=(0, 7))
  np.testing.assert_array_equal(again["sample_index"], idx)
  other, _ = minibatch.arrange(batch, cfg, seed=(0, 8))
  assert not np.array_equal(other["sample_index"], idx)


def reference_minibatch_sgd(params, batch, lr):
  """Plain full-logits SGD over the arranged batch: one step per slot holding samples, token-mean
  loss over that slot's real rows only (on-policy, so old = current before the first step)."""
  rows = batch["advantages"].shape[0]
  n_chunks = rows // 8
  slot = (np.arange(rows) % n_chunks) // 16
  old = np.asarray(full_logp(params, batch["cur_tokens"], batch["cur_attn"]))
  for k in range(int(slot.max()) + 1):
    sel = np.flatnonzero((slot == k) & (batch["sample_index"] >= 0))
    if not len(sel):
      continue

    def loss(p):
      lp = full_logp(p, batch["cur_tokens"][sel], batch["cur_attn"][sel])
      m = jnp.asarray(batch["response_mask"][sel]) > 0
      a = jnp.asarray(batch["advantages"][sel])[:, None]
      r = jnp.exp(jnp.where(m, lp - old[sel], 0.0))
      tok = jnp.maximum(-a * r, -a * jnp.clip(r, 0.8, 1.3))
      tok = jnp.where(a < 0, jnp.minimum(tok, -a * 10.0), tok)
      return jnp.sum(jnp.where(m, tok, 0.0)) / m.sum()

    g = jax.grad(loss)(params)
    params = jax.tree.map(lambda p, d: p - lr * d, params, g)
  return params


@pytest.mark.slow
def test_300_samples_take_3_steps_and_the_ratio_leaves_1():
  """docs/method.md §1 item 5: 300 turn samples in mini-batches of 128 -> 3 optimizer steps; from
  the second step on the policy has moved, so ratios leave 1 and the clip acts. Equals plain SGD per
  slot
  (padding rows add nothing; each step's denominator is its own token count)."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(5))
  cfg = update_config(
    lr=3e-2,
    minibatch_size=128,
    micro_rows=8,
    vocab_chunk=128,
    eps=1e-6,
    loss=loss_config(low_prob_mask=False),
  )
  batch, lay = minibatch.arrange(pattern_batch(300), cfg, seed=(0, 1))
  assert lay["num_minibatches"] == 3
  batch_j = jax.tree.map(jnp.asarray, batch)
  update = make_update_fn(MODEL, cfg, donate=False)
  state0 = init_train_state(params, make_optimizer(cfg))
  state, met = update(state0, batch_j)
  assert int(met["optim_steps"]) == 3 and int(state.step) == 3
  assert float(met["clipfrac_high"]) > 0 and float(met["clipfrac_low"]) > 0
  assert float(met["ratio_max"]) > 1.3 and float(met["update_norm"]) > 0

  # One mini-batch for all 300 samples: a single step, the ratio is exactly 1, nothing clips.
  one = update_config(**{**cfg.__dict__, "minibatch_size": 300})
  single, _ = minibatch.arrange(pattern_batch(300), one, seed=(0, 1))
  _, met1 = make_update_fn(MODEL, one, donate=False)(state0, jax.tree.map(jnp.asarray, single))
  assert int(met1["optim_steps"]) == 1
  np.testing.assert_allclose(met1["ratio_mean"], 1.0, rtol=1e-6)
  assert float(met1["clipfrac_high"]) == 0 == float(met1["clipfrac_low"])

  # Against plain SGD per slot, on a layout with partly filled micro-batches and an empty slot.
  sgd = optax.sgd(0.5)
  padded, lay = minibatch.arrange(pattern_batch(300), cfg, seed=(0, 1), bucket_growth=2.0)
  assert lay["slots"] == 4 and lay["num_minibatches"] == 3
  got, met_s = make_update_fn(MODEL, cfg, sgd, donate=False)(
    init_train_state(params, sgd), jax.tree.map(jnp.asarray, padded)
  )
  assert int(met_s["optim_steps"]) == 3
  want = reference_minibatch_sgd(params, padded, 0.5)
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


def test_update_compiles_once_per_bucket():
  """Different sample counts in the same bucket reuse one executable; padding slots are free."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(6))
  cfg = update_config(lr=1e-3, minibatch_size=16, micro_rows=8, vocab_chunk=128)
  update = make_update_fn(MODEL, cfg, donate=False)
  state = init_train_state(params, make_optimizer(cfg))
  steps = {}
  for n in (33, 40, 48):  # 3 mini-batches each: 3 slots of 16 rows
    batch, lay = minibatch.arrange(pattern_batch(n), cfg, seed=(0, n))
    assert lay["rows"] == 48
    _, met = update(state, jax.tree.map(jnp.asarray, batch))
    steps[n] = int(met["optim_steps"])
  assert steps == {33: 3, 40: 3, 48: 3}
  assert update._cache_size() == 1
  batch, lay = minibatch.arrange(pattern_batch(8), cfg, seed=(0, 8))  # 1 step, 1 slot
  _, met = update(state, jax.tree.map(jnp.asarray, batch))
  assert int(met["optim_steps"]) == 1 and update._cache_size() == 2


def test_packed_rows_split_by_turn_count_never_leave_an_empty_minibatch():
  counts = [4, 4, 1, 4, 2, 5, 1, 3]
  index = np.full((8, 5), -1, np.int32)
  for b, n in enumerate(counts):
    index[b, :n] = np.arange(n) + 10 * b
  batch = {"sample_index": index, "advantages": np.ones((8, 5), np.float32)}
  cfg = update_config(minibatch_size=4, micro_rows=1)
  for seed in range(20):
    out, lay = minibatch.arrange(batch, cfg, seed=seed)
    k = lay["num_minibatches"]
    assert 1 <= k <= 6 and len(lay["sizes"]) == k and min(lay["sizes"]) > 0
    assert sum(lay["sizes"]) == 8 and int(out["slot_steps"].sum()) == k
    real = out["sample_index"][(out["sample_index"] >= 0).any(axis=1)]
    assert sorted(real[real >= 0].tolist()) == sorted(index[index >= 0].tolist())


def test_packed_slots_are_powers_of_two_so_row_counts_share_one_shape():
  """Largest groups of 3 and 4 rows give one slot size (4), and 5..8 rows the next (8), with
  micro_rows 1; with micro_rows 2 the sizes are 2 x a power of two. Every row lands once."""
  seen = {}
  for micro in (1, 2):
    for rows in range(2, 17):
      index = np.full((rows, 2), -1, np.int32)
      index[:, 0] = np.arange(rows)  # one turn a row
      batch = {"sample_index": index, "advantages": np.ones((rows, 2), np.float32)}
      cfg = update_config(minibatch_size=rows, micro_rows=micro)  # one mini-batch of every row
      out, lay = minibatch.arrange(batch, cfg, seed=rows)
      units = lay["slot_rows"] // micro
      assert lay["slot_rows"] % micro == 0 and units & (units - 1) == 0, (micro, rows, lay)
      assert lay["slot_rows"] >= rows and lay["slot_rows"] < 2 * max(rows, micro)
      got = out["sample_index"][:, 0]
      assert sorted(got[got >= 0].tolist()) == list(range(rows))
      seen.setdefault(micro, set()).add(lay["rows"])
  assert seen == {1: {2, 4, 8, 16}, 2: {2, 4, 8, 16}}
