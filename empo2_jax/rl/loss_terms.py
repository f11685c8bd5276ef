"""Loss terms that compose (docs/method.md §5; docs/methods.md, "Memory into weights"): a
registered policy loss (rl/losses.POLICY_LOSSES) returns only its policy-gradient term; the update
adds every term registered here in one place (`add_terms`), each weighted by its own config key,
and may add token-level advantage terms to the advantages before the policy loss
(`token_advantages`).

    @register_loss_term("toy", keys={"toy_coef": 0.0})
    def toy(x: TermInputs, cfg) -> tuple[value, metrics]: ...   # value: a scalar, aggregated
    loss, metrics = add_terms(pg_loss, metrics, inputs, cfg)    # pg + sum(coef * value)

The terms that read a teacher view (ctx_kl, opid) live in rl/teacher_terms.py; importing
`empo2_jax.rl` registers every built-in term. A term's config keys live in the `loss` section
(defaults.py adds every registered term's keys with their defaults; rl/losses.LossConfig keeps them
in `terms`); its coefficient is the first key. A term is logged (under its name) whenever the inputs
it needs are present and added to the loss when its coefficient is not 0. A nonzero coefficient
without its inputs is an error, except for an `optional` term (the teacher terms: a batch without
any teacher view, e.g. an iteration whose memory had nothing to retrieve, simply has nothing to
distil).

Inputs (TermInputs), per token `[N, R]` over N turn samples and R response tokens:
  logp          current log-probs (with gradient)        old_logp   the ratio's denominator
  mask          final response mask (low-prob applied)   adv        advantages [N] or [N, R]
  entropy       per-token entropy (with gradient) or None
  ref_logp      the reference policy's log-probs or None (loss.kl_coef)
  teacher_logp  the same tokens under the teacher view (the prompt WITH tips; no gradient) or None
  teacher_mask  1 on the tokens of samples that have a teacher view, or None
  stats         mini-batch scalars from the terms' `stats` functions (`slot_stats`), or None
Numerics as rl/losses.py: `where` before `exp`; masked positions may hold anything.

Micro-batching: the update cuts a mini-batch into micro-batches and sums their gradients, so a
term must give the same gradient however the mini-batch is cut. Per-token sums divided by
mini-batch counts do (`token_denom`, `seq_denom`); anything else a term needs from the whole
mini-batch (a baseline, a normaliser, its own token count) comes from its `stats` function, which
the update runs once over the whole mini-batch before the micro-batches (`slot_stats`; inputs
without gradient only: old_logp, mask, adv, teacher_logp, teacher_mask). A term's `check`
validates its config values (`check_values`, called where the loss settings are built), so a bad
value fails before anything runs, naming its key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from empo2_jax.rl import losses


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
  stats: Optional[Mapping[str, Any]] = None

  def stat(self, name: str, compute: Callable):
    """A mini-batch statistic: stats[name] when the update computed it over the whole
    mini-batch (slot_stats), else compute() over these inputs (one micro-batch = the batch)."""
    if self.stats is not None and name in self.stats:
      return self.stats[name]
    return compute()

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
  # stats(TermInputs over the whole mini-batch, cfg) -> {name: scalar}, no gradient (slot_stats)
  stats: Optional[Callable] = None
  # check(values: {key: value} of its config keys) -> None; ValueError naming the key
  check: Optional[Callable] = None

  @property
  def coef_key(self) -> str:
    return next(iter(self.keys))


TERMS: dict[str, Term] = {}


def _register(name, fn, keys, needs, sign, kind, optional, stats, check):
  if name in TERMS:
    raise ValueError(f"loss term {name!r} is already registered")
  if not keys:
    raise ValueError(f"loss term {name!r}: give its config keys (the first is its coefficient)")
  TERMS[name] = Term(name, fn, dict(keys), tuple(needs), sign, kind, optional, stats, check)
  return fn


def register_loss_term(
  name: str,
  *,
  keys: Mapping[str, Any],
  needs=(),
  sign: float = 1.0,
  optional: bool = False,
  stats: Optional[Callable] = None,
  check: Optional[Callable] = None,
):
  """Decorator: registers fn(TermInputs, LossConfig) -> (scalar, metrics) as a loss term.

  Args:
    name: the term's name (its metric key); must not be registered yet.
    keys: its `loss` config keys -> defaults; the first is its coefficient.
    needs: the TermInputs fields it reads beyond the always-present ones.
    sign: the term is added to the loss as sign * coef * scalar.
    optional: True: absent inputs make the term a no-op, not an error.
    stats: fn(TermInputs, LossConfig) -> {name: scalar}: mini-batch statistics (module
      docstring), read back with TermInputs.stat.
    check: fn({key: value}) -> None raising ValueError on a bad value of its keys.
  Returns:
    A decorator that registers fn and returns it unchanged.
  """
  return lambda fn: _register(name, fn, keys, needs, sign, "loss", optional, stats, check)


def register_advantage_term(
  name: str,
  *,
  keys: Mapping[str, Any],
  needs=(),
  optional: bool = False,
  stats: Optional[Callable] = None,
  check: Optional[Callable] = None,
):
  """Decorator: registers fn(TermInputs, LossConfig) -> ([N, R] token advantages, metrics) as a
  term.

  The advantages (no gradient) are added as coef * that to the advantages the policy loss reads;
  the metrics are logged.

  Args:
    name: the term's name; must not be registered yet.
    keys: its `loss` config keys -> defaults; the first is its coefficient.
    needs: the TermInputs fields it reads beyond the always-present ones.
    optional: True: absent inputs make the term a no-op, not an error.
    stats: as for register_loss_term.
    check: as for register_loss_term.
  Returns:
    A decorator that registers fn and returns it unchanged.
  """
  return lambda fn: _register(name, fn, keys, needs, 1.0, "advantage", optional, stats, check)


def check_values(loss: Mapping[str, Any]) -> None:
  """Every registered term's check on its config values (`loss`: the loss section's key ->
  value; a key that is absent has its default); ValueError naming the key."""
  for t in TERMS.values():
    if t.check is not None:
      t.check({k: loss.get(k, default) for k, default in t.keys.items()})


def slot_stats(x: TermInputs, cfg) -> dict:
  """The mini-batch statistics of every term that has a `stats` function and whose inputs are
  present, computed over `x`: the whole mini-batch (module docstring)."""
  out: dict = {}
  for t in TERMS.values():
    if t.stats is not None and _present(t, x):
      out.update(t.stats(x, cfg))
  return out


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
  """The advantages with every active advantage term added, and the terms' metrics.

  A term is active when its coefficient is nonzero and, for an optional term, its inputs are
  present; a non-optional active term without its inputs is a ValueError.

  Args:
    x: TermInputs; x.adv is [N] or [N, R], x.logp [N, R].
    cfg: LossConfig.
  Returns:
    ([N, R] advantages when a term is active, else x.adv unchanged; the active terms' metrics).
  """
  adv, metrics = x.adv, {}
  for t in TERMS.values():
    coef = value(cfg, t.coef_key)
    if t.kind != "advantage" or not coef or (t.optional and not _present(t, x)):
      continue
    if not _present(t, x):
      raise ValueError(f"loss.{t.coef_key} > 0 needs {', '.join(t.needs)} in the batch")
    base = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, x.logp.shape)
    added, met = t.fn(x, cfg)
    added = coef * jax.lax.stop_gradient(added)
    metrics.update(met)
    metrics.update(_added_metrics(t.name, added, base, x))
    adv = base + added
  return adv, metrics


def _added_metrics(name: str, added, base, x: TermInputs) -> dict:
  """The size of an advantage term's addition over the loss's tokens: {name}/abs_added (mean
  |added|) and {name}/abs_adv (mean |advantage before it|), token means over the mini-batch (their
  ratio is the addition's size against the advantage it joins)."""
  sg = jax.lax.stop_gradient
  return {
    f"{name}/abs_added": x.token_mean(jnp.abs(sg(added))),
    f"{name}/abs_adv": x.token_mean(jnp.abs(sg(base))),
  }


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
def nonneg(key: str):
  """A term check: ValueError unless loss.<key> >= 0."""

  def check(values):
    if not values[key] >= 0:
      raise ValueError(f"loss.{key}={values[key]!r} must be >= 0")

  return check


@register_loss_term(
  "kl_ref",
  keys={"kl_coef": 0.0, "kl_estimator": "low_var_kl"},
  needs=("ref_logp",),
  check=nonneg("kl_coef"),
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


__all__ = [
  "TermInputs",
  "Term",
  "TERMS",
  "register_loss_term",
  "register_advantage_term",
  "default_keys",
  "check_values",
  "nonneg",
  "slot_stats",
  "value",
  "needs_input",
  "token_advantages",
  "add_terms",
]
