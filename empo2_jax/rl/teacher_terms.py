"""The loss terms that read a teacher view: on-policy context distillation (ctx_kl) and OPID's
hindsight token advantage (opid) (docs/methods.md, "Memory into weights"; the registry and its
contract: rl/loss_terms.py). The teacher view is the sampled response's log-probs after the
prompt WITH tips (train/teacher.py), teacher_logp, on the samples teacher_mask marks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from empo2_jax.rl import loss_terms, losses


_MAX_LOG_RATIO = 20.0  # a log-ratio beyond this is clamped before exp


def _teacher_tokens(x: loss_terms.TermInputs):
  """[N, R] bool: the loss's tokens whose sample has a teacher view."""
  return (x.mask > 0) & (x.teacher_mask > 0)


def _ctx_kl_stats(x: loss_terms.TermInputs, cfg) -> dict:
  """ctx_kl's mini-batch statistics: the teacher tokens and samples (its denominators) and the
  baseline, the mean of the clipped log-ratio log pi_old - log pi_old(.|tips) over the teacher
  tokens."""
  m = _teacher_tokens(x)
  clip = loss_terms.value(cfg, "ctx_kl_clip")
  d_old = jnp.clip(jnp.where(m, x.old_logp - x.teacher_logp, 0.0), -clip, clip)
  n = jnp.sum(m).astype(jnp.float32)
  return {
    "ctx_kl/teacher_tokens": n,
    "ctx_kl/teacher_samples": jnp.sum(jnp.any(m, axis=-1)).astype(jnp.float32),
    "ctx_kl/baseline": jnp.sum(jnp.where(m, d_old, 0.0)) / jnp.maximum(n, 1.0),
  }


def _check_ctx_kl(values) -> None:
  loss_terms.nonneg("ctx_kl_coef")(values)
  if not values["ctx_kl_clip"] > 0:
    raise ValueError(f"loss.ctx_kl_clip={values['ctx_kl_clip']!r} must be > 0 (nats)")


@loss_terms.register_loss_term(
  "ctx_kl",
  keys={"ctx_kl_coef": 0.0, "ctx_kl_clip": 10.0, "ctx_kl_baseline": True},
  needs=("teacher_logp", "teacher_mask"),
  optional=True,
  stats=_ctx_kl_stats,
  check=_check_ctx_kl,
)
def ctx_kl(x: loss_terms.TermInputs, cfg):
  """On-policy context distillation (docs/methods.md, "Memory into weights").

  The reverse KL KL(pi(.|s) || pi_old(.|s, tips)) estimated on the sampled tokens. Its gradient
  is the score function E_pi[(log pi - log pi_tips) grad log pi]; with samples from pi_old the
  token weight is the ratio r = pi / pi_old, so the surrogate per token is
  r * stop_gradient(d - b), d = log pi - log pi_tips clipped to +-loss.ctx_kl_clip. With
  loss.ctx_kl_baseline, b is the mean over the mini-batch's teacher tokens of the same log-ratio
  under the old policy (E[grad log pi] = 0, so a baseline leaves the gradient's expectation
  unchanged up to the token's own share of the mean, and lowers its variance: without it every
  sampled token the teacher finds less likely is pushed down, and the mass leaks to tokens nobody
  sampled); else b = 0. Only tokens with a teacher view count, and the term is their mean (by
  loss.agg, over the mini-batch's teacher tokens or samples): its weight does not shrink with the
  share of samples that have a teacher view. The baseline and the denominators are mini-batch
  statistics (_ctx_kl_stats), so micro-batching does not change the gradient.

  Args:
    x: loss_terms.TermInputs (logp, old_logp, mask, teacher_logp, teacher_mask, all [N, R]).
    cfg: LossConfig (terms ctx_kl_clip, ctx_kl_baseline).
  Returns:
    (value, metrics): the surrogate's mean over the teacher tokens, a scalar (its gradient is the
    KL's); metrics ctx_kl_k1 (the KL estimate over the teacher tokens) and ctx_kl_tokens (the
    share of the loss's tokens with a teacher view).
  """
  m = _teacher_tokens(x)
  stats = lambda k: x.stat(k, lambda: _ctx_kl_stats(x, cfg)[k])  # noqa: E731
  clip = loss_terms.value(cfg, "ctx_kl_clip")
  d = jnp.where(m, x.logp - x.teacher_logp, 0.0)
  dc = jax.lax.stop_gradient(jnp.clip(d, -clip, clip))
  if loss_terms.value(cfg, "ctx_kl_baseline"):
    dc = jnp.where(m, dc - stats("ctx_kl/baseline"), 0.0)
  log_ratio = jnp.clip(jnp.where(m, x.logp - x.old_logp, 0.0), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  surrogate = jnp.where(m, jnp.exp(log_ratio) * dc, 0.0)
  n_tok = jnp.maximum(stats("ctx_kl/teacher_tokens"), 1.0)
  n_seq = jnp.maximum(stats("ctx_kl/teacher_samples"), 1.0)
  met = {
    "ctx_kl_k1": jnp.sum(jnp.where(m, jax.lax.stop_gradient(d), 0.0)) / n_tok,
    "ctx_kl_tokens": x.token_mean(m.astype(jnp.float32)),  # share of the loss's tokens
  }
  return losses.aggregate(surrogate, m, x.agg, n_tok, n_seq), met


OPID_NORMS = ("none", "std")


def _opid_stats(x: loss_terms.TermInputs, cfg) -> dict:
  """OPID's mini-batch statistics: the gain's token count, mean and standard deviation over the
  teacher tokens (the divisor of loss.opid_norm="std")."""
  del cfg
  m = _teacher_tokens(x)
  g = jnp.where(m, x.teacher_logp - x.old_logp, 0.0)
  n = jnp.maximum(jnp.sum(m).astype(jnp.float32), 1.0)
  mean = jnp.sum(g) / n
  var = jnp.sum(jnp.where(m, (g - mean) ** 2, 0.0)) / n
  return {"opid/gain_tokens": n, "opid/gain_mean": mean, "opid/gain_std": jnp.sqrt(var)}


def _check_opid(values) -> None:
  loss_terms.nonneg("opid_coef")(values)
  if values["opid_norm"] not in OPID_NORMS:
    raise ValueError(f"loss.opid_norm={values['opid_norm']!r}; valid: {', '.join(OPID_NORMS)}")


@loss_terms.register_advantage_term(
  "opid",
  keys={"opid_coef": 0.0, "opid_norm": "none"},
  needs=("teacher_logp", "teacher_mask"),
  optional=True,
  stats=_opid_stats,
  check=_check_opid,
)
def opid(x: loss_terms.TermInputs, cfg):
  """OPID's hindsight token advantage (docs/methods.md).

  Per token, g = log pi_old(a | s, hindsight tip) - log pi_old(a | s), where the teacher view
  carries the hindsight tip: raw nats (loss.opid_norm="none", OPID's), or divided by the standard
  deviation of g over the mini-batch's teacher tokens ("std": the scale of normalised GRPO
  advantages; ours). The update logs opid/abs_added and opid/abs_adv (token_advantages).

  Args:
    x: loss_terms.TermInputs (old_logp, mask, teacher_logp, teacher_mask, all [N, R]).
    cfg: LossConfig (terms opid_norm).
  Returns:
    ([N, R] float32 token advantages, 0 on samples without a teacher view and on masked tokens;
    metrics opid/gain (the mean raw gain over the teacher tokens)).
  """
  m = _teacher_tokens(x)
  stats = lambda k: x.stat(k, lambda: _opid_stats(x, cfg)[k])  # noqa: E731
  gain = jnp.where(m, x.teacher_logp - x.old_logp, 0.0)
  met = {"opid/gain": jnp.sum(gain) / stats("opid/gain_tokens")}  # adds up over micro-batches
  if loss_terms.value(cfg, "opid_norm") == "std":
    gain = gain / jnp.maximum(stats("opid/gain_std"), 1e-6)
  return gain, met


__all__ = ["OPID_NORMS", "ctx_kl", "opid"]
