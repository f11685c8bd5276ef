"""EMPO2 policy loss (docs/method.md §5): PPO clipped surrogate with asymmetric and dual clipping,
and the low-probability sample mask. Tokens sampled under another policy may take a shaped,
unclipped term instead (`policy_loss(shaping_gamma_br=)`). A registered policy loss returns its
policy-gradient term only: KL-to-reference, entropy and the other terms are added by the update in
one place (rl/loss_terms.py).

All per-token arrays are `[B, R]` over the response tokens (R = padded response length); the mask
`mask_br` is 1 on real response tokens. Advantages are per sample `[B]` or per token `[B, R]`.

Numerics: every exponent goes through `jnp.where(mask, x, 0)` *before* `exp`, so padded or masked
positions can hold anything (-inf, NaN, huge) and still give a finite loss and exactly zero
gradient.

Aggregation with gradient accumulation: pass `token_denom` / `seq_denom` = the counts over the whole
optimizer mini-batch, then the per-micro-batch losses (and metrics) simply add up to the mini-batch
value. Left as None, they are the counts of the arrays given.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax.numpy as jnp

# A log-ratio beyond this is clamped before exp (exp(20) ~ 5e8 stays far inside fp32).
_MAX_LOG_RATIO = 20.0


KL_ESTIMATORS = ("k1", "k3", "low_var_kl")  # k3 and low_var_kl are the same estimator
AGGS = ("token_mean", "seq_mean")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
  """The config's `loss` section (empo2_jax/defaults.py), key for key (train/settings.py builds
  it by name; no defaults of its own)."""

  eps_low: float  # ratio clipped below at 1 - eps_low
  eps_high: float  # ratio clipped above at 1 + eps_high
  dual_clip: Optional[float]  # the dual-clip constant c > 1; 0 or None: no dual clipping
  agg: str  # "token_mean" or "seq_mean" (mean over samples of each sample's token mean)
  kl_coef: float
  kl_estimator: str  # "k1", or "k3" = "low_var_kl"
  entropy_coef: float
  low_prob_mask: bool
  low_prob_delta: float
  policy_loss: str = "ppo_clip"  # a name in POLICY_LOSSES (register_policy_loss)
  # The registered loss terms' own keys (rl/loss_terms.py) as ((key, value), ...), sorted
  terms: tuple = ()

  def __post_init__(self):
    # The only check of these keys (train/build.check_config builds this object); the messages
    # name the config keys.
    if self.policy_loss not in POLICY_LOSSES:
      raise ValueError(f"loss.policy_loss={self.policy_loss!r}; valid: {', '.join(POLICY_LOSSES)}")
    if self.agg not in AGGS:
      raise ValueError(f"loss.agg={self.agg!r}; valid: {', '.join(AGGS)}")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(
        f"loss.kl_estimator={self.kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}"
      )
    if self.dual_clip and self.dual_clip <= 1.0:
      raise ValueError(f"loss.dual_clip={self.dual_clip}; pass a value > 1, or 0 for none")


# name -> fn(logp_br, old_logp_br, adv, mask_br, cfg, *, shaping_gamma_br, token_denom, seq_denom)
# -> (policy-gradient loss, metrics): `loss.policy_loss` picks one.
POLICY_LOSSES: dict[str, Callable] = {}


def register_policy_loss(name: str):
  """Decorator: registers a policy loss under `name` in POLICY_LOSSES.

  Args:
    name: the `loss.policy_loss` value that selects it; must not be registered yet.
  Returns:
    A decorator that registers fn (policy_loss's signature and returns) and returns it unchanged.
  """

  def deco(fn):
    if name in POLICY_LOSSES:
      raise ValueError(f"policy loss {name!r} is already registered")
    POLICY_LOSSES[name] = fn
    return fn

  return deco


def get_policy_loss(name: str) -> Callable:
  """The policy loss registered under `name` (ValueError naming the valid ones if none)."""
  if name not in POLICY_LOSSES:
    raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(POLICY_LOSSES)}")
  return POLICY_LOSSES[name]


def low_prob_keep(old_logp_br, mask_br, delta):
  """Which samples the low-probability mask keeps.

  Args:
    old_logp_br: [B, R] float32 old log-probs of the response tokens.
    mask_br: [B, R] response mask, 1 on real response tokens.
    delta: float threshold (loss.low_prob_delta).
  Returns:
    [B] bool: False for a sample whose minimum old log-prob over its response is below delta.
  """
  m = mask_br > 0
  min_logp = jnp.min(jnp.where(m, old_logp_br, jnp.inf), axis=-1)
  return ~(min_logp < delta)  # samples without response tokens (min = inf) are kept


def apply_low_prob_mask(mask_br, old_logp_br, cfg: LossConfig):
  """The low-probability sample mask (loss.low_prob_mask) applied to the response mask.

  Args:
    mask_br: [B, R] response mask, 1 on real response tokens.
    old_logp_br: [B, R] float32 old log-probs of the response tokens.
    cfg: LossConfig (low_prob_mask, low_prob_delta).
  Returns:
    (mask_br, masked_b): [B, R] mask with the low-probability samples zeroed (unchanged when
    cfg.low_prob_mask is off), and [B] bool, True for the samples with tokens that were removed.
  """
  had_tokens = jnp.any(mask_br > 0, axis=-1)
  if not cfg.low_prob_mask:
    return mask_br, jnp.zeros_like(had_tokens)
  keep = low_prob_keep(old_logp_br, mask_br, cfg.low_prob_delta)
  return mask_br * keep[:, None].astype(mask_br.dtype), had_tokens & ~keep


def kl_penalty(logp_br, ref_logp_br, mask_br, kl_estimator):
  """Per-token KL(pi || ref) estimate; zero where masked.

  Args:
    logp_br: [B, R] float32 log-probs under the current policy pi.
    ref_logp_br: [B, R] float32 log-probs under the reference policy.
    mask_br: [B, R] response mask, 1 on real response tokens.
    kl_estimator: "k1" (logp - ref), or "k3" / "low_var_kl" (exp(d) - d - 1 with
      d = ref - logp, clamped to [-10, 10]).
  Returns:
    [B, R] float32 per-token estimate.
  """
  m = mask_br > 0
  if kl_estimator == "k1":
    return jnp.where(m, logp_br - ref_logp_br, 0.0)
  # k3 / "low_var_kl": exp(ref - logp) - (ref - logp) - 1, clamped like verl to [-10, 10].
  d = jnp.clip(jnp.where(m, ref_logp_br - logp_br, 0.0), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  return jnp.where(m, jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0), 0.0)


def aggregate(x_br, mask_br, agg, token_denom=None, seq_denom=None):
  """A per-token quantity reduced to a scalar, as the loss is.

  token_mean: sum(x*m) / token_denom. seq_mean: sum over samples with tokens of their token
  mean, / seq_denom.

  Args:
    x_br: [B, R] per-token values.
    mask_br: [B, R] response mask, 1 on real response tokens.
    agg: "token_mean" or "seq_mean".
    token_denom: scalar, the mini-batch's token count; None: the tokens of mask_br.
    seq_denom: scalar, the mini-batch's count of samples with tokens; None: those of mask_br.
  Returns:
    float32 scalar.
  """
  m = mask_br > 0
  xm = jnp.where(m, x_br, 0.0)
  if agg == "token_mean":
    denom = jnp.sum(m) if token_denom is None else token_denom
    return jnp.sum(xm) / jnp.maximum(denom, 1)
  n_b = jnp.sum(m, axis=-1)
  per_seq = jnp.sum(xm, axis=-1) / jnp.maximum(n_b, 1)
  denom = jnp.sum(n_b > 0) if seq_denom is None else seq_denom
  return jnp.sum(per_seq) / jnp.maximum(denom, 1)


def shaped_ratio(log_ratio, gamma):
  """Policy shaping of a ratio: w = rho / (rho + gamma), rho = exp(clip(log_ratio, -20, 20)).

  Bounded in (0, 1) and never clipped: d w / d log pi = rho gamma / (rho + gamma)^2 keeps a
  gradient where the ratio is far from 1.

  Args:
    log_ratio: log pi - log pi_old (jnp, any shape).
    gamma: the shaping constant (jnp or float, a shape that broadcasts with log_ratio).
  Returns:
    w, of the broadcast shape.
  """
  rho = jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
  return rho / (rho + gamma)


@register_policy_loss("ppo_clip")
def policy_loss(
  logp_br,
  old_logp_br,
  adv,
  mask_br,
  cfg: LossConfig,
  *,
  shaping_gamma_br=None,
  token_denom=None,
  seq_denom=None,
):
  """PPO-clip policy-gradient loss (docs/method.md §5).

  The clipped surrogate of PPO's Eq. 7 with asymmetric clip and dual clip. Where
  shaping_gamma_br > 0 (tokens sampled under another policy, e.g. docs/methods.md §6) the token's
  term is -A * shaped_ratio(log_ratio, gamma) instead of the clipped surrogate (no clipping);
  where it is 0, the clipped surrogate.

  Args:
    logp_br: [B, R] float32 log-probs of the response tokens under the current policy.
    old_logp_br: [B, R] float32 log-probs of the same tokens: the ratio's denominator.
    adv: [B] or [B, R] float32 advantages.
    mask_br: [B, R] the final response mask (low-prob mask already applied).
    cfg: LossConfig (eps_low, eps_high, dual_clip, agg).
    shaping_gamma_br: None, or [B, R] per-token constant gamma >= 0.
    token_denom: scalar, the mini-batch's token count; None: the tokens of mask_br.
    seq_denom: scalar, the mini-batch's count of samples with tokens; None: those of mask_br.
  Returns:
    (loss, metrics): the policy-gradient loss scalar and a dict of scalars. Mean metrics use the
    same token denominator as the loss (so they add up across micro-batches); `ratio_max` is a
    max.
  """
  m = mask_br > 0
  adv_br = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp_br.shape)
  adv_br = jnp.where(m, adv_br, 0.0)
  log_ratio = jnp.where(m, logp_br - old_logp_br, 0.0)
  ratio = jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))

  lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
  surr_unclipped = -adv_br * ratio
  surr_clipped = -adv_br * jnp.clip(ratio, lo, hi)
  pg = jnp.maximum(surr_unclipped, surr_clipped)
  negative = adv_br < 0
  if cfg.dual_clip:
    pg = jnp.where(negative, jnp.minimum(pg, -adv_br * cfg.dual_clip), pg)
    dual = m & negative & (ratio > cfg.dual_clip)
  else:
    dual = jnp.zeros_like(m)
  shaped = None
  if shaping_gamma_br is not None:
    shaped = m & (shaping_gamma_br > 0)
    shaped_w = shaped_ratio(log_ratio, shaping_gamma_br)
    pg = jnp.where(shaped, -adv_br * shaped_w, pg)
  pg = jnp.where(m, pg, 0.0)

  loss = aggregate(pg, mask_br, cfg.agg, token_denom, seq_denom)
  tok_mean = lambda x: aggregate(x, mask_br, "token_mean", token_denom)  # noqa: E731
  metrics = {
    "pg_loss": loss,
    "clipfrac_low": tok_mean((negative & (ratio < lo)).astype(jnp.float32)),
    "clipfrac_high": tok_mean(((adv_br > 0) & (ratio > hi)).astype(jnp.float32)),
    "clipfrac_dual": tok_mean(dual.astype(jnp.float32)),
    "ratio_mean": tok_mean(ratio),
    "ratio_max": jnp.max(jnp.where(m, ratio, 0.0)),
    # k3 estimate of KL(old || current): nonnegative, low variance.
    "approx_kl": tok_mean(ratio - 1.0 - log_ratio),
  }
  if shaped is not None:
    metrics["shaped_token_frac"] = tok_mean(shaped.astype(jnp.float32))
    # / shaped_token_frac: the mean weight of the shaped tokens
    metrics["shaped_weight_sum"] = tok_mean(jnp.where(shaped, shaped_w, 0.0))
  metrics["loss"] = loss
  return loss, metrics


@register_policy_loss("nll")
def nll_loss(
  logp_br,
  old_logp_br,
  adv,
  mask_br,
  cfg: LossConfig,
  *,
  shaping_gamma_br=None,
  token_denom=None,
  seq_denom=None,
):
  """Advantage-weighted negative log-likelihood: -A * log pi per token, no ratio and no clipping.

  With advantages 1 on chosen samples and 0 elsewhere (advantage.estimator="return_positive")
  this is supervised training on those samples' responses (filtered behaviour cloning), on the
  view the update trains: the vault bench's positive control trains the tip-free view of
  tip-guided successes (docs/vault_bench.md).

  Args: as policy_loss (old_logp_br and shaping_gamma_br are not read).
  Returns:
    (loss, metrics): the loss aggregated as cfg.agg says, and {"pg_loss", "nll_weight" (the
    token mean of A), "loss"}.
  """
  del old_logp_br, shaping_gamma_br
  m = mask_br > 0
  adv_br = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp_br.shape)
  term = jnp.where(m, -adv_br * logp_br, 0.0)
  loss = aggregate(term, mask_br, cfg.agg, token_denom, seq_denom)
  weight = aggregate(jnp.where(m, adv_br, 0.0), mask_br, "token_mean", token_denom)
  return loss, {"pg_loss": loss, "nll_weight": weight, "loss": loss}
