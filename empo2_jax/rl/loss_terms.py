"""Loss terms that compose (docs/method.md §5; docs/methods.md, "Memory into weights"): a
registered policy loss (rl/losses.POLICY_LOSSES) returns only its policy-gradient term; the update
adds every term registered here in one place (`add_terms`), each weighted by its own config key,
and may add token-level advantage terms to the advantages before the policy loss
(`token_advantages`).

    @register_loss_term("toy", keys={"toy_coef": 0.0})
    def toy(x: TermInputs, cfg) -> tuple[value, metrics]: ...   # value: a scalar, aggregated
    loss, metrics = add_terms(pg_loss, metrics, inputs, cfg)    # pg + sum(coef * value)

A term's config keys live in the `loss` section (defaults.py adds every registered term's keys
with their defaults; rl/losses.LossConfig keeps them in `terms`); its coefficient is the first
key. A term is logged (under its name) whenever the inputs it needs are present and added to the
loss when its coefficient is not 0. A nonzero coefficient without its inputs is an error, except
for an `optional` term (the teacher terms: a batch without any teacher view, e.g. an iteration
whose memory had nothing to retrieve, simply has nothing to distil).

Inputs (TermInputs), per token `[N, R]` over N turn samples and R response tokens:
  logp          current log-probs (with gradient)        old_logp   the ratio's denominator
  mask          final response mask (low-prob applied)   adv        advantages [N] or [N, R]
  entropy       per-token entropy (with gradient) or None
  ref_logp      the reference policy's log-probs or None (loss.kl_coef)
  teacher_logp  the same tokens under the teacher view (the prompt WITH tips; no gradient) or None
  teacher_mask  1 on the tokens of samples that have a teacher view, or None
Numerics as rl/losses.py: `where` before `exp`; masked positions may hold anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from empo2_jax.rl import losses

_MAX_LOG_RATIO = 20.0


@dataclasses.dataclass(frozen=True)
class TermInputs:
  logp: Any
  old_logp: Any
  mask: Any
  adv: Any
  agg: str
  entropy: Optional[Any] = None
  ref_logp: Optional[Any] = None
  teacher_logp: Optional[Any] = None
  teacher_mask: Optional[Any] = None
  token_denom: Optional[Any] = None
  seq_denom: Optional[Any] = None

  def mean(self, x_nr, mask=None):
    """x aggregated as the loss is (loss.agg, the mini-batch denominators).

    Args:
      x_nr: [N, R] per-token values.
      mask: [N, R] mask to aggregate over; None: self.mask.
    Returns:
      float32 scalar.
    """
    m = self.mask if mask is None else mask
    return losses.aggregate(x_nr, m, self.agg, self.token_denom, self.seq_denom)

  def token_mean(self, x_nr):
    """x averaged over the mini-batch's tokens (metrics that add up over micro-batches).

    Args:
      x_nr: [N, R] per-token values.
    Returns:
      float32 scalar: sum over self.mask's tokens / token_denom.
    """
    return losses.aggregate(x_nr, self.mask, "token_mean", self.token_denom)


@dataclasses.dataclass(frozen=True)
class Term:
  name: str
  fn: Callable  # fn(TermInputs, LossConfig) -> (scalar value, metrics) or per-token advantages
  keys: Mapping[str, Any]  # config keys in `loss` -> defaults; the first is the coefficient
  needs: tuple  # TermInputs fields the term reads beyond the always-present ones
  sign: float = 1.0  # loss += sign * coef * value
  kind: str = "loss"  # "loss" (added to the loss) or "advantage" (added to the advantages)
  optional: bool = False  # True: absent inputs make the term a no-op, not an error

  @property
  def coef_key(self) -> str:
    return next(iter(self.keys))


TERMS: dict[str, Term] = {}


def _register(name, fn, keys, needs, sign, kind, optional):
  if name in TERMS:
    raise ValueError(f"loss term {name!r} is already registered")
  if not keys:
    raise ValueError(f"loss term {name!r}: give its config keys (the first is its coefficient)")
  TERMS[name] = Term(name, fn, dict(keys), tuple(needs), sign, kind, optional)
  return fn


def register_loss_term(
  name: str, *, keys: Mapping[str, Any], needs=(), sign: float = 1.0, optional: bool = False
):
  """Decorator: registers fn(TermInputs, LossConfig) -> (scalar, metrics) as a loss term.

  Args:
    name: the term's name (its metric key); must not be registered yet.
    keys: its `loss` config keys -> defaults; the first is its coefficient.
    needs: the TermInputs fields it reads beyond the always-present ones.
    sign: the term is added to the loss as sign * coef * scalar.
    optional: True: absent inputs make the term a no-op, not an error.
  Returns:
    A decorator that registers fn and returns it unchanged.
  """
  return lambda fn: _register(name, fn, keys, needs, sign, "loss", optional)


def register_advantage_term(
  name: str, *, keys: Mapping[str, Any], needs=(), optional: bool = False
):
  """Decorator: registers fn(TermInputs, LossConfig) -> [N, R] token advantages as a term.

  The output (no gradient) is added as coef * that to the advantages the policy loss reads.

  Args:
    name: the term's name; must not be registered yet.
    keys: its `loss` config keys -> defaults; the first is its coefficient.
    needs: the TermInputs fields it reads beyond the always-present ones.
    optional: True: absent inputs make the term a no-op, not an error.
  Returns:
    A decorator that registers fn and returns it unchanged.
  """
  return lambda fn: _register(name, fn, keys, needs, 1.0, "advantage", optional)


def default_keys() -> dict:
  """Every registered term's config keys and defaults (defaults.py adds them to `loss`)."""
  out: dict = {}
  for t in TERMS.values():
    out.update(t.keys)
  return out


def value(cfg, key: str):
  """A term's config value: a LossConfig field or one of its `terms`.

  Args:
    cfg: LossConfig.
    key: the config key in `loss`.
  Returns:
    Its value; KeyError if `key` is neither a field nor set in cfg.terms.
  """
  if key in {f.name for f in dataclasses.fields(cfg)}:
    return getattr(cfg, key)
  terms = dict(cfg.terms)
  if key not in terms:
    raise KeyError(f"loss.{key} is not set; registered term keys: {', '.join(default_keys())}")
  return terms[key]


def _present(t: Term, x: TermInputs) -> bool:
  return all(getattr(x, n) is not None for n in t.needs)


def needs_input(cfg, name: str) -> bool:
  """Whether a term with a nonzero coefficient reads input `name`.

  Args:
    cfg: LossConfig.
    name: a TermInputs field, e.g. "teacher_logp".
  Returns:
    bool.
  """
  return any(name in t.needs and value(cfg, t.coef_key) for t in TERMS.values())


def token_advantages(x: TermInputs, cfg):
  """The advantages with every active advantage term added.

  A term is active when its coefficient is nonzero and, for an optional term, its inputs are
  present; a non-optional active term without its inputs is a ValueError.

  Args:
    x: TermInputs; x.adv is [N] or [N, R], x.logp [N, R].
    cfg: LossConfig.
  Returns:
    [N, R] advantages when a term is active, else x.adv unchanged.
  """
  adv = x.adv
  for t in TERMS.values():
    coef = value(cfg, t.coef_key)
    if t.kind != "advantage" or not coef or (t.optional and not _present(t, x)):
      continue
    if not _present(t, x):
      raise ValueError(f"loss.{t.coef_key} > 0 needs {', '.join(t.needs)} in the batch")
    base = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, x.logp.shape)
    adv = base + coef * jax.lax.stop_gradient(t.fn(x, cfg))
  return adv


def add_terms(pg_loss, metrics: dict, x: TermInputs, cfg) -> tuple[Any, dict]:
  """pg_loss plus every registered loss term.

  A term whose inputs are present is logged, and added when its coefficient is nonzero; a
  nonzero coefficient without the inputs is a ValueError unless the term is optional.

  Args:
    pg_loss: scalar, the policy loss's policy-gradient term.
    metrics: the policy loss's metrics dict (not modified).
    x: TermInputs.
    cfg: LossConfig.
  Returns:
    (loss, metrics): the total loss scalar, and a copy of metrics with each term's value under
    its name, the term's own metrics, and the total under "loss".
  """
  loss, metrics = pg_loss, dict(metrics)
  for t in TERMS.values():
    if t.kind != "loss":
      continue
    coef = value(cfg, t.coef_key)
    if not _present(t, x):
      if coef and not t.optional:
        raise ValueError(f"loss.{t.coef_key} > 0 needs {', '.join(t.needs)} in the update")
      continue
    v, met = t.fn(x, cfg)
    metrics[t.name] = v
    metrics.update(met)
    if coef:
      loss = loss + t.sign * coef * v
  metrics["loss"] = loss
  return loss, metrics


# ---------------------------------------------------------------------------------- the terms
@register_loss_term(
  "kl_ref", keys={"kl_coef": 0.0, "kl_estimator": "low_var_kl"}, needs=("ref_logp",)
)
def kl_ref(x: TermInputs, cfg):
  """KL(pi || reference) per token (rl/losses.kl_penalty, loss.kl_estimator).

  Args:
    x: TermInputs (logp, ref_logp, mask [N, R]).
    cfg: LossConfig.
  Returns:
    (value, {}): the per-token KL aggregated as the loss is (TermInputs.mean), a scalar.
  """
  return x.mean(losses.kl_penalty(x.logp, x.ref_logp, x.mask, cfg.kl_estimator)), {}


@register_loss_term("entropy", keys={"entropy_coef": 0.0}, needs=("entropy",), sign=-1.0)
def entropy(x: TermInputs, cfg):
  """The policy's entropy; subtracted (an entropy bonus).

  Args:
    x: TermInputs (entropy, mask [N, R]).
    cfg: LossConfig.
  Returns:
    (value, {}): the entropy aggregated as the loss is (TermInputs.mean), a scalar.
  """
  return x.mean(x.entropy), {}


@register_loss_term(
  "ctx_kl",
  keys={"ctx_kl_coef": 0.0, "ctx_kl_clip": 10.0, "ctx_kl_baseline": True},
  needs=("teacher_logp", "teacher_mask"),
  optional=True,
)
def ctx_kl(x: TermInputs, cfg):
  """On-policy context distillation (docs/methods.md, "Memory into weights").

  The reverse KL KL(pi(.|s) || pi_old(.|s, tips)) estimated on the sampled tokens. Its gradient
  is the score function E_pi[(log pi - log pi_tips) grad log pi]; with samples from pi_old the
  token weight is the ratio r = pi / pi_old, so the surrogate per token is
  r * stop_gradient(d - b), d = log pi - log pi_tips clipped to +-loss.ctx_kl_clip. With
  loss.ctx_kl_baseline, b is the mean of d over the micro-batch's teacher tokens (E[grad log pi]
  = 0, so a baseline leaves the gradient's expectation unchanged and lowers its variance: without
  it every sampled token the teacher finds less likely is pushed down, and the mass leaks to
  tokens nobody sampled); else b = 0. Only tokens with a teacher view count.

  Args:
    x: TermInputs (logp, old_logp, mask, teacher_logp, teacher_mask, all [N, R]).
    cfg: LossConfig (terms ctx_kl_clip, ctx_kl_baseline).
  Returns:
    (value, metrics): the surrogate aggregated as the loss is, a scalar (its gradient is the
    KL's); metrics ctx_kl_k1 (the KL estimate) and ctx_kl_tokens (the share of the loss's tokens
    with a teacher view).
  """
  m = (x.mask > 0) & (x.teacher_mask > 0)
  clip = value(cfg, "ctx_kl_clip")
  d = jnp.where(m, x.logp - x.teacher_logp, 0.0)
  dc = jax.lax.stop_gradient(jnp.clip(d, -clip, clip))
  if value(cfg, "ctx_kl_baseline"):
    dc = jnp.where(m, dc - jnp.sum(dc) / jnp.maximum(jnp.sum(m), 1), 0.0)
  log_ratio = jnp.clip(jnp.where(m, x.logp - x.old_logp, 0.0), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  surrogate = jnp.exp(log_ratio) * dc
  tokens = m.astype(jnp.float32)
  met = {
    "ctx_kl_k1": x.token_mean(jax.lax.stop_gradient(d)),
    "ctx_kl_tokens": x.token_mean(tokens),  # share of the loss's tokens with a teacher view
  }
  return x.mean(jnp.where(m, surrogate, 0.0)), met


@register_advantage_term(
  "opid", keys={"opid_coef": 0.0}, needs=("teacher_logp", "teacher_mask"), optional=True
)
def opid(x: TermInputs, cfg):
  """OPID's hindsight token advantage (docs/methods.md).

  Per token, log pi_old(a | s, hindsight tip) - log pi_old(a | s), where the teacher view carries
  the hindsight tip.

  Args:
    x: TermInputs (old_logp, mask, teacher_logp, teacher_mask, all [N, R]).
    cfg: LossConfig.
  Returns:
    [N, R] float32 token advantages; 0 on samples without a teacher view and on masked tokens.
  """
  m = (x.mask > 0) & (x.teacher_mask > 0)
  return jnp.where(m, x.teacher_logp - x.old_logp, 0.0)


__all__ = [
  "TermInputs",
  "Term",
  "TERMS",
  "register_loss_term",
  "register_advantage_term",
  "default_keys",
  "value",
  "needs_input",
  "token_advantages",
  "add_terms",
]
