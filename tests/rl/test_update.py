"""The jitted update vs a plain full-logits reference; learning direction; 8 devices == 1 device;
the update's pieces (rl/update_steps.py, rl/update_grads.py) one by one."""

import dataclasses
import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from empo2_jax.model import llama, lora
from empo2_jax.rl import loops
from empo2_jax.rl import update_grads as ug
from empo2_jax.rl import update_steps as steps
from empo2_jax.rl.update import (
  init_train_state,
  make_optimizer,
  make_update_fn,
  sample_logprobs_fn,
)
from tests.helpers.rl_settings import loss_config, update_config
from tests.helpers.tiny_model import TINY

MODEL = TINY
B, P, R = 8, 10, 4


def make_batch(seed, rows=B, vocab=512):
  rng = np.random.default_rng(seed)
  L = P + R
  prompt_len = rng.integers(3, P + 1, rows)
  resp_len = rng.integers(1, R + 1, rows)
  resp_len[-1] = 0  # a padding row

  def view(seed2):
    r2 = np.random.default_rng(seed2)
    tok = np.zeros((rows, L), np.int32)
    attn = np.zeros((rows, L), np.int32)
    for b in range(rows):
      tok[b, P - prompt_len[b] : P] = r2.integers(0, vocab, prompt_len[b])
      attn[b, P - prompt_len[b] : P + resp_len[b]] = 1
    return tok, attn

  cur_tok, cur_attn = view(seed + 1)
  old_tok, old_attn = view(seed + 2)  # a different prompt, as in the off-policy release variant
  resp = rng.integers(0, vocab, (rows, R))
  mask = (np.arange(R)[None] < resp_len[:, None]).astype(np.float32)
  for tok, attn in ((cur_tok, cur_attn), (old_tok, old_attn)):
    tok[:, P:] = np.where(mask > 0, resp, 0)
  return {
    "cur_tokens": cur_tok,
    "cur_attn": cur_attn,
    "old_tokens": old_tok,
    "old_attn": old_attn,
    "response_mask": mask,
    "sampler_logp": rng.normal(-6, 0.1, (rows, R)).astype(np.float32),
    "advantages": rng.normal(0, 1, rows).astype(np.float32),
    "sample_index": np.arange(rows, dtype=np.int32),
  }


@functools.partial(jax.jit, static_argnums=3)
def full_logp(params, tok, attn, model=MODEL):
  logits = llama.forward(params, model, jnp.asarray(tok), jnp.asarray(attn))
  lp = jax.nn.log_softmax(logits[:, P - 1 : P + R - 1], -1)
  return jnp.take_along_axis(lp, jnp.asarray(tok)[:, P:, None], -1)[..., 0]


def reference_update(params, batch, cfg, n_minibatches, opt, model=MODEL, frozen=None):
  """Full-logits forward, whole-mini-batch gradient, optax step per mini-batch. Returns the
  params, the old log-probs, the mask and each step's parameter change norm. With `frozen` (a
  LoRA base), `params` are the adapters and the model runs on both."""
  lc = cfg.loss
  with_frozen = lora.join if frozen else (lambda p, _: p)
  old = np.asarray(
    full_logp(with_frozen(params, frozen), batch["old_tokens"], batch["old_attn"], model)
  )
  mask = batch["response_mask"].copy()
  min_old = np.where(mask > 0, old, np.inf).min(1)
  mask[min_old < lc.low_prob_delta] = 0.0
  opt_state = opt.init(params)
  step_norms = []
  n_chunks = batch["advantages"].shape[0] // cfg.micro_rows
  per_mb = n_chunks // n_minibatches
  for k in range(n_minibatches):
    rows = np.array([b for b in range(len(mask)) if (b % n_chunks) // per_mb == k])

    def loss(p):
      lp = full_logp(
        with_frozen(p, frozen), batch["cur_tokens"][rows], batch["cur_attn"][rows], model
      )
      m = jnp.asarray(mask[rows]) > 0
      a = jnp.asarray(batch["advantages"][rows])[:, None]
      r = jnp.exp(jnp.where(m, lp - old[rows], 0.0))
      tok = jnp.maximum(-a * r, -a * jnp.clip(r, 1 - lc.eps_low, 1 + lc.eps_high))
      tok = jnp.where(a < 0, jnp.minimum(tok, -a * lc.dual_clip), tok)
      return jnp.sum(jnp.where(m, tok, 0.0)) / jnp.maximum(m.sum(), 1)

    g = jax.jit(jax.grad(loss))(params)
    upd, opt_state = opt.update(g, opt_state, params)
    new = optax.apply_updates(params, upd)
    step_norms.append(
      np.sqrt(
        sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(*map(jax.tree.leaves, (new, params))))
      )
    )
    params = new
  return params, old, mask, step_norms


@pytest.mark.slow
def test_update_matches_full_logits_reference(n_minibatches=2, micro_rows=2):
  """Two mini-batches of two micro-batches each (strided rows), low-prob mask on half the rows."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  batch = make_batch(0)
  old = np.asarray(full_logp(params, batch["old_tokens"], batch["old_attn"]))
  min_old = np.where(batch["response_mask"] > 0, old, np.inf).min(1)
  delta = float(np.median(min_old[np.isfinite(min_old)]))  # masks about half of the samples
  cfg = update_config(
    lr=1e-3,
    minibatch_size=B // n_minibatches,
    micro_rows=micro_rows,
    vocab_chunk=100,
    loss=loss_config(low_prob_delta=delta),
  )
  # SGD: Adam's g / (|g| + eps) would amplify float-rounding differences of near-zero gradients
  opt = optax.sgd(0.05)
  want, _, want_mask, step_norms = reference_update(params, batch, cfg, n_minibatches, opt)
  masked = (batch["response_mask"].sum(1) > 0) & (want_mask.sum(1) == 0)
  assert 0 < masked.sum() < 7

  state = init_train_state(jax.tree.map(jnp.copy, params), opt)  # the update donates its state
  state, met = make_update_fn(MODEL, cfg, opt)(state, jax.tree.map(jnp.asarray, batch))
  moved = max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params))
  )
  assert moved > 1e-4
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert int(state.step) == n_minibatches == int(met["optim_steps"])
  # update_norm: the mean over optimizer steps of each step's parameter change (global norm)
  assert len(step_norms) == n_minibatches and min(step_norms) > 0
  np.testing.assert_allclose(met["update_norm"], np.mean(step_norms), rtol=1e-4)
  np.testing.assert_allclose(met["masked_frac"], masked.sum() / 7, rtol=1e-6)
  m = batch["response_mask"] > 0
  np.testing.assert_allclose(
    met["sampler_vs_old_logp_absdiff"], np.abs(batch["sampler_logp"] - old)[m].mean(), rtol=1e-5
  )
  cur = np.asarray(full_logp(params, batch["cur_tokens"], batch["cur_attn"]))
  first = np.array([(b % 4) // 2 == 0 for b in range(B)])[:, None] & (want_mask > 0)
  assert met["ratio_max"] >= np.exp(cur - old)[first].max() * (1 - 1e-5)  # first step's ratios
  assert all(np.isfinite(v).all() for v in jax.tree.leaves(met))
  # per-sample outputs (train/view_metrics.py reads them): the reference's mask and old log-probs
  per = jax.tree.map(np.asarray, met["per_sample"])
  np.testing.assert_array_equal(per["masked"][:, 0], masked)
  np.testing.assert_array_equal(per["tokens"][:, 0], m.sum(1))
  has = m.any(1)
  np.testing.assert_allclose(per["min_old_logp"][has, 0], min_old[has], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(per["min_old_logp"][~has, 0], 0.0)
  np.testing.assert_allclose(
    per["old_logp_sum"][:, 0], np.where(m, old, 0).sum(1), rtol=1e-5, atol=1e-5
  )


def test_positive_advantage_raises_logprob():
  params = llama.init_params(MODEL, jax.random.PRNGKey(1))
  batch = make_batch(3)
  batch["advantages"] = np.zeros(B, np.float32)
  batch["advantages"][2] = 1.0
  batch["old_tokens"], batch["old_attn"] = batch["cur_tokens"], batch["cur_attn"]  # on-policy
  cfg = update_config(lr=1e-3, micro_rows=4, vocab_chunk=128, loss=loss_config(low_prob_mask=False))
  logp = sample_logprobs_fn(MODEL, cfg)
  before = np.asarray(logp(params, batch["cur_tokens"], batch["cur_attn"], R))
  state = init_train_state(params, make_optimizer(cfg))
  state, met = make_update_fn(MODEL, cfg)(state, jax.tree.map(jnp.asarray, batch))
  after = np.asarray(logp(state.params, batch["cur_tokens"], batch["cur_attn"], R))
  m = batch["response_mask"][2] > 0
  assert after[2][m].sum() > before[2][m].sum() + 1e-3
  np.testing.assert_allclose(met["ratio_mean"], 1.0, rtol=1e-5)  # on-policy: starts at 1


def test_kl_needs_reference_and_bad_rows_rejected():
  params = llama.init_params(MODEL, jax.random.PRNGKey(2))
  batch = jax.tree.map(jnp.asarray, make_batch(4))
  cfg = update_config(micro_rows=4, vocab_chunk=128, loss=loss_config(kl_coef=0.01))
  fn = make_update_fn(MODEL, cfg, donate=False)
  state = init_train_state(params, make_optimizer(cfg))
  with pytest.raises(ValueError, match="ref_params"):
    fn(state, batch)
  _, met = fn(state, batch, params)  # reference == policy: KL starts at 0
  np.testing.assert_allclose(met["kl_ref"], 0.0, atol=1e-6)
  with pytest.raises(ValueError, match="multiple"):
    make_update_fn(MODEL, update_config(micro_rows=3), donate=False)(state, batch)
  with pytest.raises(ValueError, match="slot"):  # 8 rows are not whole slots of 6
    make_update_fn(MODEL, update_config(minibatch_size=6, micro_rows=2), donate=False)(state, batch)


SHARDED_SCRIPT = textwrap.dedent("""
    import dataclasses, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as PS
    from tests.rl.test_update import MODEL, make_batch
    MODEL = dataclasses.replace(MODEL, remat="__REMAT__")  # full: the fused layer gradients
    from empo2_jax.model import llama, lora
    from empo2_jax.rl.update import init_train_state, make_optimizer, make_update_fn
    from tests.helpers.rl_settings import loss_config, update_config
    assert jax.device_count() == 8, jax.devices()
    cfg = update_config(lr=1e-3, minibatch_size=16, micro_rows=8, vocab_chunk=100,
                       eps=1e-4, loss=loss_config(low_prob_mask=False))
    batch = jax.tree.map(jnp.asarray, make_batch(7, rows=32))
    params = llama.init_params(MODEL, jax.random.PRNGKey(0))
    opt = make_optimizer(cfg)
    one = jax.device_put(init_train_state(jax.tree.map(jnp.copy, params), opt), jax.devices()[0])
    s1, m1 = make_update_fn(MODEL, cfg)(one, jax.device_put(batch, jax.devices()[0]))
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4, 1), ("data", "fsdp", "tensor"))
    def spec(x):  # shard the last axis over fsdp where it divides, like FSDP
        return PS(*([None] * (x.ndim - 1) + ["fsdp"])) if x.ndim and x.shape[-1] % 4 == 0 else PS()
    pshard = jax.tree.map(lambda x: NamedSharding(mesh, spec(x)), params)
    placed = jax.device_put(jax.tree.map(jnp.copy, params), pshard)
    state = jax.jit(lambda p: init_train_state(p, opt))(placed)
    bshard = NamedSharding(mesh, PS(("data", "fsdp")))
    s8, m8 = make_update_fn(MODEL, cfg, batch_sharding=bshard)(state, jax.device_put(batch, bshard))
    assert s8.params["layers"]["w_up"].sharding.spec == pshard["layers"]["w_up"].spec
    d = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree.leaves(s8.params), jax.tree.leaves(s1.params)))
    dm = max(abs(float(m8[k]) - float(m1[k])) / (abs(float(m1[k])) + 1e-6)
             for k in m1 if k != "per_sample")
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(s1.params), jax.tree.leaves(params)))
    print("RESULT", d, dm, moved)
""")


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["none", "full"])
def test_update_on_8_devices_matches_one_device(remat):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run(
    [sys.executable, "-c", SHARDED_SCRIPT.replace("__REMAT__", remat)],
    env=env,
    cwd=root,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
  d, dm, moved = map(float, line.split()[1:])
  assert moved > 1e-4  # the update changed the params, so agreement is not trivial
  assert d < 1e-5 and dm < 1e-4, line


DIFF_KEYS = ("_diff_sum", "_diff_n", "_diff_max")  # the first step's |logp - old| sums
STEP_CFG = update_config(
  lr=1e-3, minibatch_size=4, micro_rows=2, vocab_chunk=100, loss=loss_config(low_prob_mask=False)
)


def slots(params, batch, cfg=STEP_CFG, model=MODEL):
  """make_batch rows through the update's first pieces: (chunks, has_tokens_c, old log-probs
  [n_chunks, mb, 1, R], data [n_slots, n_micro, mb, ...], has_samples_s)."""
  packed = steps.as_packed(jax.tree.map(jnp.asarray, batch))
  ch, n_slots = steps.chunk_batch(packed, cfg)
  keep = jnp.any(ch["response_mask"] > 0, axis=(1, 2, 3))
  sampler = jnp.where(packed["response_mask"] > 0, packed["sampler_logp"], 0.0)
  setup = ug.UpdateSetup(model, cfg)
  old, use = steps.old_view_logprobs(params, ch, sampler, keep, setup=setup)
  mask, _, _, _ = steps.old_view_stats(
    packed["response_mask"], steps.from_chunks(old), sampler, use, cfg.loss
  )
  data, has = steps.minibatch_data(ch, old, mask, keep, n_slots, setup=setup)
  return ch, keep, old, data, has


def test_chunks_and_old_logprobs_of_the_pieces():
  """chunk_batch's strided layout, no_grad_logprobs == the full-logits reference (zeros on a chunk
  left out), and old_logp_source taking the sampler's or recomputing by the dynamic flag."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  batch = make_batch(0)
  ch, keep, old, data, has = slots(params, batch)
  assert ch["cur_tokens"].shape == (4, 2, P + R) and ch["cur_starts"].shape == (4, 2, 1)
  np.testing.assert_array_equal(ch["cur_tokens"][1, 1], batch["cur_tokens"][5])  # b % 4 == 1
  np.testing.assert_array_equal(steps.from_chunks(ch["old_attn"]), batch["old_attn"])
  assert data["mask"].shape == (2, 2, 2, 1, R) and np.asarray(has).tolist() == [True, True]
  m = batch["response_mask"] > 0
  want = np.asarray(full_logp(params, batch["old_tokens"], batch["old_attn"]))
  np.testing.assert_allclose(np.asarray(steps.from_chunks(old))[:, 0][m], want[m], atol=1e-5)
  part = ug.no_grad_logprobs(
    params,
    ch["old_tokens"],
    ch["old_attn"],
    ch["old_starts"],
    R,
    keep.at[1].set(False),
    setup=ug.UpdateSetup(MODEL, STEP_CFG),
  )
  np.testing.assert_array_equal(part[1], 0.0)
  np.testing.assert_allclose(part[0], old[0], atol=1e-6)
  sampler = jnp.where(m, batch["sampler_logp"], 0.0)[:, None]
  smp_cfg = dataclasses.replace(STEP_CFG, old_logp_source="sampler")
  for flag in (None, True, False):
    smp = ug.UpdateSetup(MODEL, smp_cfg)
    got, use = steps.old_view_logprobs(params, ch, sampler, keep, flag, setup=smp)
    assert bool(use) == (flag is not False)
    np.testing.assert_allclose(
      steps.from_chunks(got), sampler if bool(use) else steps.from_chunks(old), atol=1e-6
    )
  with pytest.raises(ValueError, match="slot"):
    steps.chunk_batch(steps.as_packed(batch), update_config(minibatch_size=6, micro_rows=2))


@pytest.mark.parametrize("fuse", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_micro_batch_gradients_add_up_to_the_minibatch_step(fuse):
  """micro_batch_grads over a slot's two micro-batches == the gradient of minibatch_loss on the
  slot as one micro-batch (fused or not), and minibatch_step is one optimizer step with it."""
  model = dataclasses.replace(MODEL, remat="full")  # scanned layers + full remat: fusable
  params = llama.init_params(model, jax.random.PRNGKey(1))
  _, _, _, data, _ = slots(params, make_batch(1), model=model)
  d = jax.tree.map(lambda x: x[0], data)  # slot 0: leaves [n_micro, mb, ...]
  token_denom = jnp.sum(d["mask"])
  seq_denom = jnp.sum(jnp.any(d["mask"] > 0, axis=-1))
  opt = optax.sgd(0.05)  # Adam's g / (|g| + eps) would amplify rounding in near-zero gradients
  setup = ug.UpdateSetup(model, STEP_CFG, opt, fuse)

  @jax.jit
  def accumulated(params, d):
    grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    for j in range(2):
      dj = jax.tree.map(lambda x: x[j], d)
      grads, _ = ug.micro_batch_grads(params, dj, grads, token_denom, seq_denom, setup=setup)
    return grads

  whole = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), d)  # the slot's 4 rows at once
  loss = functools.partial(ug.minibatch_loss, setup=setup)
  (_, met), want = jax.jit(jax.value_and_grad(loss, has_aux=True))(
    params, whole, token_denom, seq_denom
  )
  got = accumulated(params, d)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert float(optax.global_norm(want)) > 0 and set(DIFF_KEYS) <= set(met)

  state = init_train_state(params, opt)
  step = jax.jit(functools.partial(ug.minibatch_step, setup=setup))
  new, met = step(state, d)
  assert isinstance(new, type(state)) and int(new.step) == 1
  updates, _ = opt.update(want, state.opt_state, params)
  for a, b in zip(
    jax.tree.leaves(new.params), jax.tree.leaves(optax.apply_updates(params, updates))
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(met["grad_norm"], optax.global_norm(want), rtol=1e-5)
  np.testing.assert_allclose(met["update_norm"], optax.global_norm(updates), rtol=1e-5)


def test_epochs_step_only_the_slots_with_samples_and_metrics_average_them():
  """run_epochs: epochs x (slots with samples) optimizer steps, the first step's _diff_ sums kept
  apart; finish_metrics averages over those steps (ratio_max: the max) and picks the
  sampler-vs-old figures by old_from_sampler."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(2))
  _, _, _, data, _ = slots(params, make_batch(2))
  cfg = dataclasses.replace(STEP_CFG, epochs=2)
  opt = make_optimizer(cfg)
  run = jax.jit(functools.partial(steps.run_epochs, setup=ug.UpdateSetup(MODEL, cfg, opt)))
  state, met_sum, first = run(init_train_state(params, opt), data, jnp.array([True, False]))
  assert int(state.step) == 2 and set(first) == set(DIFF_KEYS)
  assert not set(met_sum) & set(DIFF_KEYS) and {"grad_norm", "update_norm"} <= set(met_sum)

  met_sum = {"loss": jnp.float32(6.0), "ratio_max": jnp.float32(1.5)}
  first = {"_diff_sum": jnp.float32(2.0), "_diff_n": jnp.float32(4.0), "_diff_max": 0.75}
  diff = jnp.array([[[0.1, 0.3]]])
  for use, absdiff, maxdiff in ((False, 0.2, 0.3), (True, 0.5, 0.75)):
    met = steps.finish_metrics(
      met_sum, first, {"n_tokens": 2.0}, diff, 2, jnp.asarray(use), jnp.array([1, 0, 1]) > 0, 3
    )
    assert int(met["optim_steps"]) == 6 and met["n_tokens"] == 2.0
    np.testing.assert_allclose([met["loss"], met["ratio_max"]], [1.0, 1.5])
    np.testing.assert_allclose(met["sampler_vs_old_logp_absdiff"], absdiff, rtol=1e-6)
    np.testing.assert_allclose(met["sampler_vs_old_logp_maxdiff"], maxdiff, rtol=1e-6)


def test_inverse_temperatures_and_constrain_without_sharding():
  inv = ug.inv_temperature(jnp.array([0.0, 0.5]), 0.8)
  np.testing.assert_allclose(inv, [1.25, 2.0])
  assert ug.inv_temperature(None, 0.8) is None
  tree = {"a": jnp.ones(2)}
  assert loops.constrain(tree, None) is tree
  setup = ug.UpdateSetup(MODEL, STEP_CFG, optax.sgd(0.1))
  assert hash(setup) == hash(ug.UpdateSetup(MODEL, STEP_CFG, setup.optimizer))  # a static arg
  with pytest.raises(dataclasses.FrozenInstanceError):
    setup.fuse = True
