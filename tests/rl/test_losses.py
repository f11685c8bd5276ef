"""Policy loss and low-prob mask vs a per-token numpy reference; extreme inputs stay finite."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from empo2_jax.rl import loss_terms, losses
from tests.helpers.rl_settings import loss_config


def composed_loss(logp, old, adv, mask, cfg, ref=None, ent=None):
  """The update's loss: the policy loss plus the loss terms (rl/loss_terms.add_terms)."""
  pg, met = losses.policy_loss(logp, old, adv, mask, cfg)
  x = loss_terms.TermInputs(
    logp=logp, old_logp=old, mask=mask, adv=adv, agg=cfg.agg, entropy=ent, ref_logp=ref
  )
  return loss_terms.add_terms(pg, met, x, cfg)


def ref_token_loss(logp, old, adv, eps_lo, eps_hi, c):
  """Scalar PPO-clip with dual clip, written out branch by branch."""
  r = np.exp(logp - old)
  unclipped = -adv * r
  clipped = -adv * min(max(r, 1 - eps_lo), 1 + eps_hi)
  loss = max(unclipped, clipped)
  if c is not None and adv < 0:
    loss = min(loss, -adv * c)
  return loss, r


def ref_loss(logp, old, adv_b, mask, cfg, ref=None, ent=None):
  B, R = logp.shape
  tok = np.zeros((B, R))
  ratios = np.zeros((B, R))
  for b in range(B):
    for t in range(R):
      if mask[b, t]:
        tok[b, t], ratios[b, t] = ref_token_loss(
          logp[b, t], old[b, t], adv_b[b], cfg.eps_low, cfg.eps_high, cfg.dual_clip
        )

  def agg(x):
    if cfg.agg == "token_mean":
      return (x * mask).sum() / mask.sum()
    rows = [(x[b] * mask[b]).sum() / mask[b].sum() for b in range(B) if mask[b].sum() > 0]
    return np.mean(rows)

  total = agg(tok)
  if ref is not None:
    if cfg.kl_estimator == "k1":
      kl = logp - ref
    else:
      d = ref - logp
      kl = np.clip(np.exp(d) - d - 1, -10, 10)
    total += cfg.kl_coef * agg(kl)
  if ent is not None:
    total -= cfg.entropy_coef * agg(ent)
  return total, ratios


def make_inputs(seed, B=6, R=7, spread=2.0):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.5, 1.0, (B, R))
  old = logp + rng.normal(0, spread, (B, R))  # ratios far outside [0.8, 1.3], some > 10
  adv = rng.normal(0, 1.5, B)
  mask = (rng.random((B, R)) < 0.8).astype(np.float64)
  mask[0] = 0.0  # one sample with no response tokens
  return logp, old, adv, mask


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("dual", [10.0, None])
def test_policy_loss_matches_reference(agg, dual):
  cfg = loss_config(agg=agg, dual_clip=dual)
  logp, old, adv, mask = make_inputs(0)
  want, ratios = ref_loss(logp, old, adv, mask, cfg)
  m = mask > 0
  # every branch is visited
  assert np.any(m & (adv[:, None] < 0) & (ratios > 10))  # dual clip
  assert np.any(m & (adv[:, None] > 0) & (ratios > 1.3))  # clipped high
  assert np.any(m & (adv[:, None] < 0) & (ratios < 0.8))  # clipped low
  assert np.any(m & (ratios > 0.8) & (ratios < 1.3))  # unclipped
  f = jax.jit(lambda *a: losses.policy_loss(*a, cfg))
  loss, met = f(*(jnp.asarray(x, jnp.float32) for x in (logp, old, adv, mask)))
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  neg, pos = adv[:, None] < 0, adv[:, None] > 0
  n = mask.sum()
  np.testing.assert_allclose(met["clipfrac_low"], (m & neg & (ratios < 0.8)).sum() / n, rtol=1e-6)
  np.testing.assert_allclose(met["clipfrac_high"], (m & pos & (ratios > 1.3)).sum() / n, rtol=1e-6)
  want_dual = (m & neg & (ratios > 10)).sum() / n if dual else 0.0
  np.testing.assert_allclose(met["clipfrac_dual"], want_dual, rtol=1e-6)
  np.testing.assert_allclose(met["ratio_mean"], ratios[m].mean(), rtol=1e-5)
  np.testing.assert_allclose(met["ratio_max"], ratios[m].max(), rtol=1e-5)
  lr = (logp - old)[m]
  np.testing.assert_allclose(met["approx_kl"], (np.exp(lr) - 1 - lr).mean(), rtol=1e-4)


def test_loss_gradient_matches_finite_difference_per_branch():
  cfg = loss_config()
  # one token per sample, one per branch: unclipped, clipped high, clipped low, dual clip
  old = np.log(np.array([[1.0], [1.0], [1.0], [1.0]]))
  ratio = np.array([[1.1], [2.0], [0.5], [20.0]])
  adv = np.array([1.0, 1.0, -1.0, -1.0])
  logp = old + np.log(ratio)
  mask = np.ones((4, 1))
  g = jax.grad(
    lambda lp: losses.policy_loss(
      lp,
      jnp.asarray(old, jnp.float32),
      jnp.asarray(adv, jnp.float32),
      jnp.asarray(mask, jnp.float32),
      cfg,
    )[0]
  )(jnp.asarray(logp, jnp.float32))
  # d/dlogp of -A*r / N = -A*r/N on the unclipped branch, 0 on clipped and dual-clipped ones
  np.testing.assert_allclose(np.asarray(g)[:, 0], [-1.1 / 4, 0, 0, 0], atol=1e-6)


@pytest.mark.parametrize("kl_estimator", ["k1", "k3", "low_var_kl"])
def test_kl_and_entropy_terms(kl_estimator):
  cfg = loss_config(kl_coef=0.01, kl_estimator=kl_estimator, entropy_coef=0.003)
  logp, old, adv, mask = make_inputs(1)
  rng = np.random.default_rng(2)
  ref = logp + rng.normal(0, 3.0, logp.shape)  # some low_var_kl values hit the clamp at 10
  ent = rng.random(logp.shape) * 3
  want, _ = ref_loss(logp, old, adv, mask, cfg, ref=ref, ent=ent)
  loss, met = composed_loss(
    *(jnp.asarray(x, jnp.float32) for x in (logp, old, adv, mask)),
    cfg,
    ref=jnp.asarray(ref, jnp.float32),
    ent=jnp.asarray(ent, jnp.float32),
  )
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  assert "kl_ref" in met and "entropy" in met
  with pytest.raises(ValueError, match="ref_logp"):
    composed_loss(*(jnp.asarray(x, jnp.float32) for x in (logp, old, adv, mask)), cfg)


def test_low_prob_mask_matches_reference():
  rng = np.random.default_rng(3)
  B, R = 8, 5
  old = rng.normal(-2, 2, (B, R))
  mask = (rng.random((B, R)) < 0.7).astype(np.float32)
  mask[1] = 0
  old[2, 0], mask[2, 0] = -30.0, 0.0  # a very low log-prob on a padded token must not count
  cfg = loss_config(low_prob_delta=-5.0)
  keep = np.array([not (mask[b].sum() > 0 and old[b][mask[b] > 0].min() < -5.0) for b in range(B)])
  new_mask, masked = losses.apply_low_prob_mask(jnp.asarray(mask), jnp.asarray(old), cfg)
  np.testing.assert_array_equal(np.asarray(new_mask), mask * keep[:, None])
  np.testing.assert_array_equal(np.asarray(masked), (~keep) & (mask.sum(1) > 0))
  assert 0 < (~keep).sum() < B
  off, masked_off = losses.apply_low_prob_mask(
    jnp.asarray(mask), jnp.asarray(old), loss_config(low_prob_mask=False)
  )
  np.testing.assert_array_equal(np.asarray(off), mask)
  assert not np.any(np.asarray(masked_off))


def test_extreme_inputs_finite_and_masked_samples_zero_grad():
  cfg = loss_config(kl_coef=0.01, entropy_coef=0.01)
  B, R = 4, 6
  rng = np.random.default_rng(4)
  logp = jnp.asarray(rng.normal(-1, 0.5, (B, R)), jnp.float32)
  old = np.full((B, R), -1.0, np.float32)
  old[0] = -50.0  # ratio e^49: masked by the low-prob mask
  old[1, :3] = float(np.log(1e-6))  # ratios of ~1e6, kept (min old logp -13.8 -> masked too)
  old[2] = -1.0 - np.log(1e6)  # ratio 1e6 with delta disabled below
  mask = np.ones((B, R), np.float32)
  adv = jnp.asarray([2.0, -3.0, -1.0, 1.0])
  ref = logp - 40.0  # KL terms at their clamps
  ent = jnp.ones((B, R))

  def f(lp, delta):
    c = loss_config(kl_coef=0.01, entropy_coef=0.01, low_prob_delta=delta)
    m, _ = losses.apply_low_prob_mask(jnp.asarray(mask), jnp.asarray(old), c)
    # masked positions hold garbage in the current log-probs: must not leak
    lp = jnp.where(m > 0, lp, jnp.nan)
    return composed_loss(lp, jnp.asarray(old), adv, m, cfg, ref=ref, ent=ent)[0]

  for delta in (-5.0, -100.0):
    loss, g = jax.value_and_grad(f)(logp, delta)
    assert np.isfinite(loss) and np.all(np.isfinite(g))
  loss, g = jax.value_and_grad(f)(logp, -5.0)
  assert np.all(np.asarray(g)[:3] == 0.0)  # samples 0, 1, 2 masked: exactly zero
  assert np.any(np.asarray(g)[3] != 0.0)


def test_denominators_make_microbatches_add_up():
  cfg = loss_config()
  logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in make_inputs(5, B=8))
  full, met_full = losses.policy_loss(logp, old, adv, mask, cfg)
  parts = [
    losses.policy_loss(
      logp[i : i + 4], old[i : i + 4], adv[i : i + 4], mask[i : i + 4], cfg, token_denom=mask.sum()
    )
    for i in (0, 4)
  ]
  np.testing.assert_allclose(sum(p[0] for p in parts), full, rtol=1e-6)
  np.testing.assert_allclose(
    sum(p[1]["ratio_mean"] for p in parts), met_full["ratio_mean"], rtol=1e-6
  )


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="agg"):
    loss_config(agg="sum")
  with pytest.raises(ValueError, match="dual_clip"):
    loss_config(dual_clip=0.5)


def test_policy_loss_registry_picks_the_loss_by_name():
  """loss.policy_loss names a function in rl/losses.POLICY_LOSSES; the update calls that one."""
  from empo2_jax.rl.update import init_train_state, make_update_fn
  from tests.rl.test_update import MODEL, make_batch

  import optax

  from empo2_jax.model import llama
  from tests.helpers.rl_settings import update_config

  calls = []

  @losses.register_policy_loss("toy_loss")
  def toy(logp_br, old_logp_br, adv, mask_br, cfg, **kw):
    calls.append(cfg.policy_loss)
    return losses.policy_loss(logp_br, old_logp_br, adv, mask_br, cfg, **kw)

  try:
    assert losses.get_policy_loss("ppo_clip") is losses.policy_loss
    assert loss_config().policy_loss == "ppo_clip"
    with pytest.raises(ValueError, match="valid: ppo_clip, nll, toy_loss"):
      loss_config(policy_loss="nope")
    with pytest.raises(ValueError, match="already registered"):
      losses.register_policy_loss("toy_loss")(toy)
    cfg = update_config(loss=loss_config(policy_loss="toy_loss"), micro_rows=2, minibatch_size=8)
    params = llama.init_params(MODEL, jax.random.PRNGKey(0))
    state = init_train_state(params, optax.sgd(0.1))
    make_update_fn(MODEL, cfg, optax.sgd(0.1))(state, jax.tree.map(jnp.asarray, make_batch(0)))
    assert calls and set(calls) == {"toy_loss"}  # traced once per compiled program
  finally:
    del losses.POLICY_LOSSES["toy_loss"]


def test_nll_loss_is_the_advantage_weighted_log_likelihood():
  """loss.policy_loss="nll" against numpy: -sum(A * log p) over the mask / the token count; its
  gradient is -A / n on each kept token (no ratio, no clipping)."""
  rng = np.random.default_rng(5)
  logp = rng.normal(-2, 1, (4, 6))
  mask = (rng.random((4, 6)) < 0.7).astype(np.float32)
  adv = np.array([1.0, 0.0, 1.0, 0.5])
  cfg = dataclasses.replace(loss_config(), policy_loss="nll")
  fn = losses.get_policy_loss("nll")
  old = logp + 3.0  # not read
  val, met = fn(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), cfg)
  want = -np.sum(adv[:, None] * logp * mask) / mask.sum()
  np.testing.assert_allclose(val, want, rtol=1e-5)
  np.testing.assert_allclose(met["nll_weight"], np.sum(adv[:, None] * mask) / mask.sum(), rtol=1e-6)
  g = jax.grad(lambda lp: fn(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), cfg)[0])(
    jnp.asarray(logp, jnp.float32)
  )
  np.testing.assert_allclose(g, -adv[:, None] * mask / mask.sum(), rtol=1e-5, atol=1e-8)
