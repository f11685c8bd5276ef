"""The pieces of one EMPO2 update call (rl/update.py's docstring: old log-probs, low-prob mask, PPO
mini-batches), each a pure function of what it uses. rl/update.make_update_fn binds the update's
fixed settings (rl/update_grads.UpdateSetup: model config, UpdateConfig, optimizer, fuse, batch
sharding) and jits `update`, their composition:

    update
      chunk_batch                 rows -> micro-batch chunks, the mini-batch slot count
      old_view_logprobs           docs/method.md §4: recomputed (no_grad_logprobs) or the sampler's
      old_view_stats              docs/method.md §5: the low-prob mask; batch-level metrics
      minibatch_data              what the loss reads, in slots (and the reference log-probs)
      run_epochs                  epochs x slots with samples: minibatch_step each
        minibatch_step            (rl/update_grads.py) gradient accumulation over the
                                  micro-batches (micro_batch_grads, minibatch_loss), one optax step
      finish_metrics              the metrics dict

Shapes: B rows of L tokens, T turn samples a row (T = 1 for a one-row-per-turn batch, as_packed),
R response tokens a turn. The rows are read in n_chunks = B // micro_rows chunks of mb =
micro_rows rows (to_chunks: row b in chunk b % n_chunks), and the chunks in n_slots mini-batch
slots of n_micro = n_chunks // n_slots chunks each.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from empo2_jax.model import lora
from empo2_jax.rl.loops import any_after_first, combine_metrics, index_tree, nonempty_loop
from empo2_jax.rl.losses import apply_low_prob_mask
from empo2_jax.rl.update_grads import (
  RATIO_HIST_BINS,
  RATIO_HIST_MAX,
  UpdateSetup,
  minibatch_step,
  no_grad_logprobs,
)

# The batch's optional per-turn inputs (rl/batch.py; present when some turn has them): each
# response token's sampling temperature [B, T, R] (0: UpdateConfig.temperature), read by the
# log-probs as 1/T per token, and the policy-shaping constant [B, T] (0: the clipped surrogate),
# read by the loss (rl/losses.policy_loss, shaping_gamma_br).
OPTIONAL_KEYS = ("token_temperature", "shaping_gamma")
# The teacher view (rl/batch.py; present when some turn has one): the response's log-probs after
# the prompt WITH tips under the weights the update starts from, teacher_logp [B, T, R], and
# teacher_mask [B, T] (1: the turn has them), read by the loss terms (rl/loss_terms.py).
TEACHER_KEYS = ("teacher_logp", "teacher_mask")
# Per-step sums of the first mini-batch's |log-prob - old log-prob| (the sampler-vs-recompute
# check when the old log-probs come from the sampler): kept out of the averaged step metrics.
_DIFF_KEYS = ("_diff_sum", "_diff_n", "_diff_max")
# Sums over every step (rl/update_grads.ratio_measures), turned into figures by finish_metrics
_RATIO_KEYS = ("_ratio_hist", "_pos_n", "_pos_low_n")


def to_chunks(x, n_chunks):
  """[B, ...] -> [n_chunks, B // n_chunks, ...] with row b in chunk b % n_chunks."""
  rows = x.shape[0] // n_chunks
  return jnp.swapaxes(x.reshape((rows, n_chunks) + x.shape[1:]), 0, 1)


def from_chunks(x):
  """Inverse of to_chunks."""
  x = jnp.swapaxes(x, 0, 1)
  return x.reshape((-1,) + x.shape[2:])


def as_packed(batch):
  """A one-row-per-turn batch (rl/batch.build_batch) in the packed layout with T = 1: each row's
  single turn starts at L - R (the response block). A packed batch is returned unchanged."""
  if "cur_starts" in batch:
    return batch
  out = dict(batch)
  length, resp_len = batch["cur_tokens"].shape[1], batch["response_mask"].shape[1]
  starts = jnp.full((batch["cur_tokens"].shape[0], 1), length - resp_len, jnp.int32)
  out["cur_starts"] = out["old_starts"] = starts
  for k in ("response_mask", "sampler_logp", "advantages", "sample_index") + (
    OPTIONAL_KEYS + TEACHER_KEYS
  ):
    if k in batch:
      out[k] = jnp.asarray(batch[k])[:, None]
  return out


def per_sample_stats(resp_mask, old_logp, masked):
  """Per turn sample ([B, T] each) of the update's old view: `masked` (the low-probability mask
  removed it), `min_old_logp` (its lowest old log-prob over real response tokens; 0 without
  any), `old_logp_sum` and `tokens` (real response tokens). The trainer maps them back to the
  turns through sample_index (train/view_metrics.py)."""
  real = resp_mask > 0
  return {
    "masked": masked,
    "min_old_logp": jnp.where(
      jnp.any(real, axis=-1), jnp.min(jnp.where(real, old_logp, jnp.inf), axis=-1), 0.0
    ),
    "old_logp_sum": jnp.sum(jnp.where(real, old_logp, 0.0), axis=-1),
    "tokens": jnp.sum(real, axis=-1).astype(jnp.int32),
  }


def chunk_batch(batch, cfg):
  """A packed batch (as_packed) in micro-batch chunks: the keys the update reads, [B, ...] each,
  -> [n_chunks, mb, ...] (to_chunks; n_chunks = B // cfg.micro_rows, mb = cfg.micro_rows), and
  the number of mini-batch slots n_slots: the length of rl/minibatch.arrange's slot_steps, else
  B // min(cfg.minibatch_rows, B). Raises ValueError when B is not a multiple of micro_rows or
  of the slot's rows. Returns (chunks dict, n_slots)."""
  n_rows = batch["response_mask"].shape[0]
  if n_rows % cfg.micro_rows:
    raise ValueError(
      f"batch rows {n_rows} must be a multiple of micro_rows={cfg.micro_rows} "
      "(lay the batch out with rl/minibatch.arrange)"
    )
  # rl/minibatch.arrange says how many slots there are (packed rows: its own slot size).
  slot_rows = (
    n_rows // batch["slot_steps"].shape[0]
    if "slot_steps" in batch
    else min(cfg.minibatch_rows, n_rows)
  )
  if n_rows % slot_rows:
    raise ValueError(
      f"batch rows {n_rows} must be a multiple of the mini-batch slot "
      f"{slot_rows} rows (minibatch_size={cfg.minibatch_size} rounded up to "
      f"micro_rows={cfg.micro_rows}); lay it out with rl/minibatch.arrange"
    )
  n_chunks = n_rows // cfg.micro_rows
  used = (
    "cur_tokens",
    "cur_attn",
    "cur_starts",
    "old_tokens",
    "old_attn",
    "old_starts",
    "advantages",
    "response_mask",
    "sample_index",
  )
  used += tuple(k for k in OPTIONAL_KEYS + TEACHER_KEYS if k in batch)
  return {k: to_chunks(batch[k], n_chunks) for k in used}, n_rows // slot_rows


def view_logprobs(params, ch, view, has_tokens_c, setup: UpdateSetup):
  """no_grad_logprobs of one view of the chunked batch ch (chunk_batch): view "old" (the ratio's
  denominator) or "cur" (the trained view, scored under the reference weights for the KL term)
  -> [n_chunks, mb, T, R]."""
  return no_grad_logprobs(
    params,
    ch[f"{view}_tokens"],
    ch[f"{view}_attn"],
    ch[f"{view}_starts"],
    ch["response_mask"].shape[-1],
    has_tokens_c,
    ch.get("token_temperature"),
    setup=setup,
  )


def old_view_logprobs(params, ch, sampler_logp, has_tokens_c, old_from_sampler=None, *, setup):
  """The old log-probs of every row (docs/method.md §4), [n_chunks, mb, T, R], and old_from_sampler
  (bool scalar: they are the sampler's). Recomputed by no_grad_logprobs over the old view of the
  chunks ch (chunk_batch) that have response tokens (has_tokens_c [n_chunks]), or, with
  cfg.old_logp_source == "sampler" and old_from_sampler true (None: true), the sampler's log-probs
  sampler_logp [B, T, R] in chunks, with no forward pass; in "sampler" mode one program serves
  both (lax.cond runs only the branch taken)."""
  n_chunks = ch["old_tokens"].shape[0]
  recompute = functools.partial(view_logprobs, params, ch, "old", has_tokens_c, setup)
  if setup.cfg.old_logp_source == "sampler":
    old_from_sampler = jnp.asarray(
      True if old_from_sampler is None else old_from_sampler, jnp.bool_
    )
    # One program for both: lax.cond runs only the branch taken.
    old_logp = jax.lax.cond(old_from_sampler, lambda: to_chunks(sampler_logp, n_chunks), recompute)
  else:
    old_from_sampler = jnp.asarray(False)
    old_logp = recompute()
  return old_logp, old_from_sampler


def old_view_stats(full_mask, old_flat, sampler_logp, old_from_sampler, loss_cfg):
  """The low-probability sample mask (docs/method.md §5) and the old view's batch-level figures:
  full_mask (response mask), old_flat (old log-probs) and sampler_logp, [B, T, R] each, and
  old_from_sampler (bool scalar) -> (mask [B, T, R]: full_mask with the masked turn samples zeroed,
  metrics: masked_frac, old_logp_mean, n_tokens, old_from_sampler and per_sample
  (per_sample_stats), batch_diff [B, T, R]: |sampler_logp - old_flat| on real tokens, n_tok: the
  real response tokens, at least 1)."""
  resp_len = full_mask.shape[-1]
  turns = lambda x: x.reshape((-1, resp_len))  # noqa: E731  [B*T, R]: one turn sample a row
  mask, masked_b = apply_low_prob_mask(turns(full_mask), turns(old_flat), loss_cfg)
  mask = mask.reshape(full_mask.shape)
  n_with_tokens = jnp.maximum(jnp.sum(jnp.any(full_mask > 0, axis=-1)), 1)
  n_tok = jnp.maximum(jnp.sum(full_mask), 1)
  batch_diff = jnp.where(full_mask > 0, jnp.abs(sampler_logp - old_flat), 0.0)
  metrics = {
    "masked_frac": jnp.sum(masked_b) / n_with_tokens,
    "old_logp_mean": jnp.sum(jnp.where(full_mask > 0, old_flat, 0.0)) / n_tok,
    "n_tokens": jnp.sum(mask),
    "old_from_sampler": old_from_sampler.astype(jnp.float32),
    "per_sample": per_sample_stats(full_mask, old_flat, masked_b.reshape(full_mask.shape[:2])),
  }
  return mask, metrics, batch_diff, n_tok


def minibatch_data(ch, old_logp, mask, has_tokens_c, n_slots, ref_params=None, *, setup):
  """What the loss reads, in mini-batch slots: from the chunks ch (chunk_batch), the old
  log-probs old_logp [n_chunks, mb, T, R] and the low-prob-masked response mask [B, T, R] ->
  (data, has_samples_s). data: leaves [n_slots, n_micro, mb, ...]: the cur view, old_logp,
  advantages, mask, resp_mask, the optional keys present, and with cfg.loss.kl_coef the
  reference policy's log-probs of the cur view (no_grad_logprobs of ref_params over the chunks
  with has_tokens_c; ValueError without ref_params), and the teacher view's keys where present.
  has_samples_s [n_slots]: the slots holding real samples (sample_index >= 0)."""
  n_chunks = ch["cur_tokens"].shape[0]
  data = {
    "cur_tokens": ch["cur_tokens"],
    "cur_attn": ch["cur_attn"],
    "cur_starts": ch["cur_starts"],
    "old_logp": old_logp,
    "advantages": ch["advantages"],
    "mask": to_chunks(mask, n_chunks),
    "resp_mask": ch["response_mask"],
  }
  for k in OPTIONAL_KEYS + TEACHER_KEYS:
    if k in ch:
      data[k] = ch[k]
  if setup.cfg.loss.kl_coef:
    if ref_params is None:
      raise ValueError("LossConfig.kl_coef > 0: pass ref_params to the update")
    data["ref_logp"] = view_logprobs(ref_params, ch, "cur", has_tokens_c, setup)
  # [n_chunks, mb, ...] -> [n_slots, n_micro, mb, ...]
  split = lambda x: x.reshape((n_slots, n_chunks // n_slots) + x.shape[1:])  # noqa: E731
  data = jax.tree.map(split, data)
  # A slot with real samples takes a step even if the low-prob mask emptied it (as verl's
  # optimizer.step() does: AdamW momentum and weight decay still apply).
  return data, any_after_first(split(ch["sample_index"]) >= 0)


def _slot_step(k, carry, *, data, step_fn):
  """Loop body of run_epochs: slot k's optimizer step (step_fn: minibatch_step with its settings
  bound); the step metrics combined into the carry's sums, the _diff_ sums kept from the
  first step taken only."""
  state, met_sum, first, n_done = carry
  state, met = step_fn(state, index_tree(data, k))
  diff = {key: met.pop(key) for key in _DIFF_KEYS}  # kept for the first step only
  first = jax.tree.map(lambda a, b: jnp.where(n_done == 0, b, a), first, diff)
  return state, combine_metrics(met_sum, met), first, n_done + 1


def _epoch(_, carry, *, has_samples_s, slot_step):
  """Loop body of run_epochs: one PPO epoch, slot_step over the slots with samples, in order."""
  return nonempty_loop(has_samples_s, slot_step, carry)


def run_epochs(state, data, has_samples_s, *, setup):
  """The PPO epochs (docs/method.md §1 item 5): cfg.epochs passes over the mini-batch slots of
  data (minibatch_data: leaves [n_slots, n_micro, mb, ...]) with has_samples_s [n_slots], one
  minibatch_step per slot with samples, in order (after the first step the policy has moved, so
  later ratios leave 1). Returns (state, met_sum: the step metrics summed over the steps taken,
  a max for *_max, first: the first step's _diff_sum, _diff_n and _diff_max)."""
  step_fn = functools.partial(minibatch_step, setup=setup)
  met_shape = jax.eval_shape(lambda s: step_fn(s, index_tree(data, 0))[1], state)
  met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), met_shape)
  first0 = {k: met0.pop(k) for k in _DIFF_KEYS}
  slot_step = functools.partial(_slot_step, data=data, step_fn=step_fn)
  epoch = functools.partial(_epoch, has_samples_s=has_samples_s, slot_step=slot_step)
  carry0 = (state, met0, first0, jnp.zeros((), jnp.int32))
  state, met_sum, first, _ = jax.lax.fori_loop(0, setup.cfg.epochs, epoch, carry0)
  return state, met_sum, first


def ratio_figures(hist, pos_n, pos_low_n) -> dict:
  """The ratio r = pi / pi_old over every loss token of the update's steps, from the summed
  histogram of log r (rl/update_grads.ratio_measures): ratio_p5 / p50 / p95 (bin centres, bins
  of width 2 * RATIO_HIST_MAX / RATIO_HIST_BINS in log r) and pos_adv_low_ratio, the share of
  positive-advantage tokens with r < 1 - eps_low."""
  width = 2 * RATIO_HIST_MAX / RATIO_HIST_BINS
  centres = -RATIO_HIST_MAX + width * (jnp.arange(RATIO_HIST_BINS) + 0.5)
  cum = jnp.cumsum(hist) / jnp.maximum(jnp.sum(hist), 1.0)
  out = {}
  for q in (5, 50, 95):
    i = jnp.minimum(jnp.searchsorted(cum, q / 100.0), RATIO_HIST_BINS - 1)
    out[f"ratio_p{q}"] = jnp.where(jnp.sum(hist) > 0, jnp.exp(centres[i]), 1.0)
  out["pos_adv_low_ratio"] = pos_low_n / jnp.maximum(pos_n, 1.0)
  return out


def finish_metrics(
  met_sum, first, view_metrics, batch_diff, n_tok, old_from_sampler, has_samples_s, epochs
):
  """The update's metrics (rl/update.make_update_fn's docstring) from run_epochs' met_sum and
  first, old_view_stats' view_metrics, batch_diff [B, T, R] and n_tok, old_from_sampler and
  has_samples_s [n_slots]: the step metrics averaged over the epochs * (slots with samples)
  optimizer steps (ratio_max: their max), optim_steps, the view metrics, and
  sampler_vs_old_logp_absdiff / _maxdiff over the whole batch when the old log-probs were
  recomputed, else over the first step's forward pass (unchanged weights, so its log-probs are
  the recomputed old ones)."""
  absdiff = jnp.where(
    old_from_sampler,
    first["_diff_sum"] / jnp.maximum(first["_diff_n"], 1),
    jnp.sum(batch_diff) / n_tok,
  )
  maxdiff = jnp.where(old_from_sampler, first["_diff_max"], jnp.max(batch_diff))
  met_sum = dict(met_sum)
  ratio = {}  # absent only where a caller sums its own step metrics
  if all(k in met_sum for k in _RATIO_KEYS):
    ratio = ratio_figures(*(met_sum.pop(k) for k in _RATIO_KEYS))
  steps = epochs * jnp.sum(has_samples_s.astype(jnp.int32))
  met = {k: (v if k == "ratio_max" else v / jnp.maximum(steps, 1)) for k, v in met_sum.items()}
  met["optim_steps"] = steps
  met.update(ratio)
  met.update(view_metrics)
  met["sampler_vs_old_logp_absdiff"] = absdiff
  met["sampler_vs_old_logp_maxdiff"] = maxdiff
  return met


def update(state, batch, ref_params=None, old_from_sampler=None, *, setup: UpdateSetup):
  """One whole update (rl/update.py's docstring): the state and a batch (rl/batch.build_batch
  rows [B, ...] or packed rows with turns [B, T, ...], laid out by rl/minibatch.arrange), the
  reference params with cfg.loss.kl_coef (None with LoRA: the state's frozen base, the adapters
  off, is the reference), old_from_sampler (bool scalar or None; "sampler" mode) -> (state after
  the optimizer steps, metrics: finish_metrics). rl/update.make_update_fn binds `setup` and jits
  this."""
  cfg = setup.cfg
  adapters, base = lora.split(state.params)
  if ref_params is None and adapters:
    ref_params = base
  batch = as_packed(batch)
  ch, n_slots = chunk_batch(batch, cfg)
  has_tokens_c = any_after_first(ch["response_mask"] > 0)  # [n_chunks]
  full_mask = batch["response_mask"]  # [B, T, R]
  sampler_logp = jnp.where(full_mask > 0, batch["sampler_logp"], 0.0).astype(jnp.float32)
  old_logp, old_from_sampler = old_view_logprobs(
    state.params, ch, sampler_logp, has_tokens_c, old_from_sampler, setup=setup
  )
  mask, view_metrics, batch_diff, n_tok = old_view_stats(
    full_mask, from_chunks(old_logp), sampler_logp, old_from_sampler, cfg.loss
  )
  data, has_samples_s = minibatch_data(
    ch, old_logp, mask, has_tokens_c, n_slots, ref_params, setup=setup
  )
  state, met_sum, first = run_epochs(state, data, has_samples_s, setup=setup)
  return state, finish_metrics(
    met_sum, first, view_metrics, batch_diff, n_tok, old_from_sampler, has_samples_s, cfg.epochs
  )
