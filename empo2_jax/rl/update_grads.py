"""One mini-batch of the EMPO2 update (rl/update_steps.py composes them over the batch): the
response log-probs of a micro-batch, the policy loss, its gradient accumulated over the slot's
micro-batches and one optimizer step, each a pure function of what it uses. The update's fixed
settings travel as one object, UpdateSetup; the loops are rl/loops.py's.

    minibatch_step            gradient accumulation over micro-batches, one optax step
      micro_batch_grads       one micro-batch's gradient into the accumulator
        minibatch_loss        the policy loss of one micro-batch (chunk_logprobs)
    no_grad_logprobs          chunk_logprobs of a whole view without gradient (old, reference)

Shapes as in rl/update_steps.py: mb rows of L tokens a micro-batch, T turn samples a row, R
response tokens a turn.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from empo2_jax.model import lora
from empo2_jax.rl import loss_terms
from empo2_jax.rl.loops import (
  any_after_first,
  combine_metrics,
  constrain,
  index_tree,
  map_nonempty,
  nonempty_loop,
)
from empo2_jax.rl.losses import get_policy_loss
from empo2_jax.rl.packing import packed_response_logprobs


@dataclasses.dataclass(frozen=True)
class UpdateSetup:
  """The update's fixed settings: what every piece of rl/update_steps.py and this module reads
  besides its arrays. rl/update.make_update_fn builds one and binds it; frozen and hashable, so
  it can also be a static argument of jax.jit.

  Attributes:
    model_config: the policy's model/configs.LlamaConfig.
    cfg: the rl/update.UpdateConfig (optim keys, rollout.temperature, the loss section).
    optimizer: the optax transformation of a step (global-norm clip + AdamW); None where no
      step is taken (log-probs only).
    fuse: the layers' gradient accumulated in place during the backward (model/grad_accum.py).
    batch_sharding: the sharding every micro-batch's rows are constrained to, or None.
  """

  model_config: Any
  cfg: Any
  optimizer: Optional[optax.GradientTransformation] = None
  fuse: bool = False
  batch_sharding: Any = None


def _add(total, g):
  """total + g leaf by leaf, g cast into the float32 accumulator `total`."""
  return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), total, g)


def inv_temperature(token_temp, temperature):
  """Per-token sampling temperatures [..., R] (0: the training `temperature`) -> the inverse
  temperatures 1/tau [..., R] the log-probs scale the logits by; None without per-token
  temperatures (the log-probs then take `temperature` itself)."""
  if token_temp is None:
    return None
  return jnp.where(token_temp > 0, 1.0 / jnp.maximum(token_temp, 1e-6), 1.0 / temperature)


def chunk_logprobs(
  params,
  tokens,
  attn,
  starts,
  resp_len,
  setup: UpdateSetup,
  *,
  with_entropy=False,
  token_temp=None,
  layer_grads=None,
):
  """Log-probs of one micro-batch's response tokens, the vocabulary projected cfg.vocab_chunk
  columns at a time (rl/packing.py).

  Args:
    params: the policy's weights.
    tokens, attn: [mb, L] packed rows.
    starts: [mb, T] each turn's response start.
    resp_len: R, the response tokens a turn.
    setup: the update's settings (model_config; cfg.temperature, cfg.vocab_chunk).
    with_entropy: also return the entropies.
    token_temp: [mb, T, R] per-token sampling temperatures (0: cfg.temperature), or None.
    layer_grads: the fused gradient accumulator of the layers (model/grad_accum.py), or None.
  Returns:
    log-probs [mb, T, R]; with with_entropy, (log-probs, entropies [mb, T, R]).
  """
  cfg = setup.cfg
  return packed_response_logprobs(
    params,
    setup.model_config,
    tokens,
    attn,
    starts,
    resp_len,
    temperature=cfg.temperature,
    chunk_size=cfg.vocab_chunk,
    with_entropy=with_entropy,
    inv_temperature=inv_temperature(token_temp, cfg.temperature),
    layer_grads=layer_grads,
  )


def no_grad_logprobs(params, tokens_c, attn_c, starts_c, resp_len, keep_c, temp_c=None, *, setup):
  """Log-probs without gradient of one whole view, micro-batch by micro-batch: chunks tokens_c /
  attn_c [n_chunks, mb, L], starts_c [n_chunks, mb, T] (and per-token temperatures temp_c
  [n_chunks, mb, T, R]) -> [n_chunks, mb, T, R], chunk_logprobs of the chunks with keep_c
  [n_chunks] true (those holding response tokens), zeros for the others, which are not
  forwarded. Serves the old log-probs (docs/method.md §4) and the reference policy's."""
  params = jax.lax.stop_gradient(params)
  logp = functools.partial(chunk_logprobs, setup=setup)
  batch_sharding = setup.batch_sharding
  if temp_c is None:
    return map_nonempty(
      lambda x: logp(params, *constrain(x, batch_sharding), resp_len),
      (tokens_c, attn_c, starts_c),
      keep_c,
    )
  return map_nonempty(
    lambda x: logp(params, *constrain(x[:3], batch_sharding), resp_len, token_temp=x[3]),
    (tokens_c, attn_c, starts_c, temp_c),
    keep_c,
  )


# The off-policy ratio's distribution: a histogram of log r over [-RATIO_HIST_MAX, +RATIO_HIST_MAX]
# (outside it, the edge bins), summed over micro-batches and steps; rl/update_steps.finish_metrics
# turns it into the quantiles ratio_p5 / p50 / p95.
RATIO_HIST_BINS = 160
RATIO_HIST_MAX = 8.0


def ratio_measures(x, adv, cfg) -> dict:
  """Sums over one micro-batch's loss tokens (x: rl/loss_terms.TermInputs; adv [N] or [N, R]):
  _ratio_hist [RATIO_HIST_BINS] the counts of log r = logp - old_logp per bin; _pos_n the tokens
  with A > 0 and _pos_low_n those among them with r < 1 - eps_low (where the clipped surrogate
  shrinks a positive advantage's update toward zero)."""
  m = x.mask > 0
  log_r = jax.lax.stop_gradient(jnp.where(m, x.logp - x.old_logp, 0.0))
  width = 2 * RATIO_HIST_MAX / RATIO_HIST_BINS
  idx = jnp.clip(((log_r + RATIO_HIST_MAX) / width).astype(jnp.int32), 0, RATIO_HIST_BINS - 1)
  hist = (
    jnp.zeros((RATIO_HIST_BINS,), jnp.float32)
    .at[idx.reshape(-1)]
    .add(m.reshape(-1).astype(jnp.float32))
  )
  adv_nr = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, log_r.shape)
  pos = m & (adv_nr > 0)
  low = pos & (log_r < jnp.log(1.0 - cfg.eps_low))
  return {
    "_ratio_hist": hist,
    "_pos_n": jnp.sum(pos).astype(jnp.float32),
    "_pos_low_n": jnp.sum(low).astype(jnp.float32),
  }


def term_inputs(d, agg: str, **given) -> loss_terms.TermInputs:
  """The loss terms' inputs from batch leaves whose last axes are [T] (per turn) or [T, R] (per
  token), any leading axes before them ([mb] of a micro-batch, [n_micro, mb] of a slot): every
  turn a row ([N, R] / [N]), teacher_mask broadcast over the response; `given` sets the rest
  (logp, entropy, the denominators, the mini-batch stats)."""
  lead = d["mask"].ndim - 1  # the axes before R: ... x T
  flat = lambda x: None if x is None else x.reshape((-1,) + x.shape[lead:])  # noqa: E731
  teacher_mask = d.get("teacher_mask")
  if teacher_mask is not None:  # [..., T] -> [..., T, R]
    teacher_mask = jnp.broadcast_to(teacher_mask[..., None], d["mask"].shape)
  return loss_terms.TermInputs(
    old_logp=flat(d["old_logp"]),
    mask=flat(d["mask"]),
    adv=flat(d["advantages"]),
    agg=agg,
    ref_logp=flat(d.get("ref_logp")),
    teacher_logp=flat(d.get("teacher_logp")),
    teacher_mask=flat(teacher_mask),
    **{"logp": None, **given},
  )


def minibatch_loss(params, d, token_denom, seq_denom, layer_grads=None, *, setup, stats=None):
  """The policy loss (docs/method.md §5; cfg.loss.policy_loss) of one micro-batch d, leaves [mb,
  ...]: cur_tokens / cur_attn [mb, L], cur_starts [mb, T], old_logp / mask (the low-prob-masked
  response mask) / resp_mask [mb, T, R], advantages [mb, T], and where present
  token_temperature [mb, T, R], shaping_gamma [mb, T], ref_logp [mb, T, R], teacher_logp [mb,
  T, R] and teacher_mask [mb, T]. Its turns are read as mb * T samples, summed over the
  mini-batch denominators token_denom / seq_denom (scalars), so micro-batch losses add up to the
  mini-batch's; `stats` are the loss terms' mini-batch statistics (rl/loss_terms.slot_stats; None:
  computed over d). The loss is the policy loss (cfg.loss.policy_loss, on the advantages with any
  advantage term added) plus the loss terms (rl/loss_terms.add_terms). Returns (scalar loss,
  metrics): the loss's and terms' metrics, ratio_measures' sums and the _diff_ sums of |log-prob
  - old log-prob| over every real response token."""
  lcfg = setup.cfg.loss
  resp_len = d["mask"].shape[-1]
  logp, ent = chunk_logprobs(
    params,
    d["cur_tokens"],
    d["cur_attn"],
    d["cur_starts"],
    resp_len,
    setup,
    with_entropy=True,
    token_temp=d.get("token_temperature"),
    layer_grads=layer_grads,
  )
  gamma = d.get("shaping_gamma")
  if gamma is not None:  # [mb, T] -> [mb, T, R]
    gamma = jnp.broadcast_to(gamma[..., None], logp.shape)
  flat = lambda x: None if x is None else x.reshape((-1,) + x.shape[2:])  # noqa: E731  turns
  real = d["resp_mask"] > 0  # every real response token (the low-prob mask not applied)
  diff = jnp.where(real, jnp.abs(jax.lax.stop_gradient(logp) - d["old_logp"]), 0.0)
  diff_met = {
    "_diff_sum": jnp.sum(diff),
    "_diff_n": jnp.sum(real).astype(jnp.float32),
    "_diff_max": jnp.max(diff),
  }
  x = term_inputs(
    d,
    lcfg.agg,
    logp=flat(logp),
    entropy=flat(ent),
    token_denom=token_denom,
    seq_denom=seq_denom,
    stats=stats,
  )
  adv, adv_met = loss_terms.token_advantages(x, lcfg)  # advantage terms (OPID's) added per token
  pg, met = get_policy_loss(lcfg.policy_loss)(
    x.logp,
    x.old_logp,
    adv,
    x.mask,
    lcfg,
    shaping_gamma_br=flat(gamma),
    token_denom=token_denom,
    seq_denom=seq_denom,
  )
  loss, met = loss_terms.add_terms(pg, {**met, **adv_met}, x, lcfg)
  met.update(ratio_measures(x, adv, lcfg))
  return loss, {**met, **diff_met}


def _rest_loss(rest, acc, *, layers, d, token_denom, seq_denom, setup, stats):
  """minibatch_loss as a function of the params but the layers (`rest`) and the layers'
  gradient accumulator `acc`, the layers themselves held fixed (micro_batch_grads, fused)."""
  params = {**rest, "layers": layers}
  return minibatch_loss(params, d, token_denom, seq_denom, acc, setup=setup, stats=stats)


def micro_batch_grads(params, d, grads, token_denom, seq_denom, *, setup, stats=None):
  """One micro-batch's contribution to its mini-batch's gradient: d (leaves [mb, ...], as
  minibatch_loss reads them) -> (grads + the gradient of minibatch_loss over `params`, the loss's
  metrics); grads is the float32 accumulator shaped like what the update trains (lora.trainable:
  the LoRA adapters, or every weight). With setup.fuse the layers'
  gradient goes straight into grads["layers"] (the cotangent of layer_grads is layer_grads + this
  micro-batch's layer gradient, model/grad_accum.py: no second params-sized buffer for the
  layers); the rest (embedding, final norm, lm head) is summed as usual."""
  train, frozen = lora.trainable(params)
  if setup.fuse and not frozen:
    layers = params["layers"]
    rest = {k: v for k, v in params.items() if k != "layers"}
    rest_loss = functools.partial(
      _rest_loss,
      layers=layers,
      d=d,
      token_denom=token_denom,
      seq_denom=seq_denom,
      setup=setup,
      stats=stats,
    )
    fused_grad = jax.value_and_grad(rest_loss, argnums=(0, 1), has_aux=True)
    (_, met), (g_rest, acc) = fused_grad(rest, grads["layers"])
    return {**_add({k: grads[k] for k in g_rest}, g_rest), "layers": acc}, met

  def loss_fn(train):  # the frozen part (LoRA's base) is a constant: no gradient is formed
    return minibatch_loss(
      lora.join(train, frozen), d, token_denom, seq_denom, setup=setup, stats=stats
    )

  (_, met), g = jax.value_and_grad(loss_fn, has_aux=True)(train)
  return _add(grads, g), met


def _accumulate(j, carry, *, params, d, token_denom, seq_denom, setup, stats):
  """Loop body of minibatch_step: micro-batch j of d ([n_micro, mb, ...] leaves) added into the
  carry (float32 gradient accumulator, summed metrics)."""
  grads, met_sum = carry
  dj = constrain(index_tree(d, j), setup.batch_sharding)
  grads, met = micro_batch_grads(
    params, dj, grads, token_denom, seq_denom, setup=setup, stats=stats
  )
  return grads, combine_metrics(met_sum, met)


def slot_stats(d, setup) -> dict:
  """The loss terms' statistics over a whole mini-batch slot d (leaves [n_micro, mb, ...]; the
  inputs without gradient: old_logp, mask, advantages, teacher_logp, teacher_mask), computed once
  before its micro-batches (rl/loss_terms.slot_stats): what makes a term's gradient the same
  however the slot is cut into micro-batches."""
  return loss_terms.slot_stats(term_inputs(d, setup.cfg.loss.agg), setup.cfg.loss)


def minibatch_step(state, d, *, setup):
  """One optimizer step on one mini-batch slot (docs/method.md §1 item 5): d holds the slot's
  micro-batches, leaves [n_micro, mb, ...] (as minibatch_loss reads them). The gradients of the
  micro-batches with response tokens are summed in float32 (the loss denominators are the slot's
  own token / sequence counts, so accumulation equals one large batch; an empty micro-batch adds
  exactly zero and is skipped), then setup.optimizer (global-norm clipping + AdamW) takes one
  step.
  Returns (state with new params, opt_state and step + 1, metrics): the loss metrics summed over
  the micro-batches (a max for *_max), grad_norm and update_norm (||the parameter change||)."""
  mask = d["mask"]
  token_denom = jnp.sum(mask)
  seq_denom = jnp.sum(jnp.any(mask > 0, axis=-1))
  stats = slot_stats(d, setup)
  met_shape = jax.eval_shape(
    lambda: minibatch_loss(
      state.params, index_tree(d, 0), token_denom, seq_denom, setup=setup, stats=stats
    )[1]
  )
  train, frozen = lora.trainable(state.params)  # LoRA: the adapters; else every weight
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train)
  met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), met_shape)
  micro = functools.partial(
    _accumulate,
    params=state.params,
    d=d,
    token_denom=token_denom,
    seq_denom=seq_denom,
    setup=setup,
    stats=stats,
  )
  # A micro-batch without response tokens adds exactly zero to every sum: skipped.
  grads, met = nonempty_loop(any_after_first(mask > 0), micro, (zeros, met0))
  met["grad_norm"] = optax.global_norm(grads)
  updates, opt_state = setup.optimizer.update(grads, state.opt_state, train)
  # This step's parameter change, from the update itself: no copy of the pre-update params
  # is held (it cost a params-sized buffer: 0.5 GiB for SmolLM2, 7.1 GiB a chip for 7B).
  met["update_norm"] = optax.global_norm(updates)
  params = lora.join(optax.apply_updates(train, updates), frozen)
  return state._replace(params=params, opt_state=opt_state, step=state.step + 1), met
