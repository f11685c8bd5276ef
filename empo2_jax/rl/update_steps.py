"""The pieces of one EMPO2 update call (rl/update.py's docstring: old log-probs, low-prob mask, PPO
mini-batches), each a pure function of what it uses. rl/update.make_update_fn binds the settings
(model config, UpdateConfig, optimizer, fuse, batch sharding) with functools.partial and jits
`update`, their composition:

    update
      chunk_batch                 rows -> micro-batch chunks, the mini-batch slot count
      old_logprobs                docs/method.md §4: recomputed (no_grad_logprobs) or the sampler's
      old_view_stats              docs/method.md §5: the low-prob mask; batch-level metrics
      minibatch_data              what the loss reads, in slots (and the reference log-probs)
      run_epochs                  epochs x slots with samples: minibatch_step each
        minibatch_step            gradient accumulation over micro-batches, one optax step
          micro_batch_grads       one micro-batch's gradient into the accumulator
            minibatch_loss        the policy loss of one micro-batch (chunk_logprobs)
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
import optax

from empo2_jax.rl.losses import apply_low_prob_mask, get_policy_loss
from empo2_jax.rl.packing import packed_response_logprobs

# The batch's optional per-turn inputs (rl/batch.py; present when some turn has them): each
# response token's sampling temperature [B, T, R] (0: UpdateConfig.temperature), read by the
# log-probs as 1/T per token, and the policy-shaping constant [B, T] (0: the clipped surrogate),
# read by the loss (rl/losses.policy_loss, shaping_gamma_br).
OPTIONAL_KEYS = ("token_temperature", "shaping_gamma")
# Per-step sums of the first mini-batch's |log-prob - old log-prob| (the sampler-vs-recompute
# check when the old log-probs come from the sampler): kept out of the averaged step metrics.
_DIFF_KEYS = ("_diff_sum", "_diff_n", "_diff_max")


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
  for k in ("response_mask", "sampler_logp", "advantages", "sample_index") + OPTIONAL_KEYS:
    if k in batch:
      out[k] = jnp.asarray(batch[k])[:, None]
  return out


def _any_after_first(x):
  """[N, ...] -> [N]: any nonzero entry beyond the leading axis."""
  return jnp.any(x != 0, axis=tuple(range(1, x.ndim)))


def _index(tree, i):
  return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), tree)


def _nonempty_loop(keep, body, carry):
  """carry = body(j, carry) for the indices j with keep[j] (in order); a dynamic trip count."""
  order = jnp.argsort(jnp.where(keep, 0, 1), stable=True)  # kept indices first, in order
  return jax.lax.fori_loop(
    0, jnp.sum(keep.astype(jnp.int32)), lambda i, c: body(order[i], c), carry
  )


def _map_nonempty(f, xs, keep):
  """[f(x_j) if keep[j] else zeros for j] stacked, f run on the kept leading slices only."""
  out_shape = jax.eval_shape(f, _index(xs, 0))
  out = jnp.zeros((keep.shape[0],) + out_shape.shape, out_shape.dtype)
  return _nonempty_loop(
    keep, lambda j, o: jax.lax.dynamic_update_index_in_dim(o, f(_index(xs, j)), j, 0), out
  )


def _combine(total, met):
  """Running combination of per-step (or per-micro-batch) metrics: sums, and a max for the keys
  ending in _max (ratio_max, _diff_max)."""
  return {
    k: (jnp.maximum(total[k], v) if k.endswith("_max") else total[k] + v) for k, v in met.items()
  }


def _add(total, g):
  """total + g leaf by leaf, g cast into the float32 accumulator `total`."""
  return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), total, g)


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


def constrain(tree, batch_sharding=None):
  """Every leaf of `tree` (one micro-batch: leaves [mb, ...]) constrained to `batch_sharding`
  (rows spread over the devices), or `tree` unchanged when batch_sharding is None."""
  if batch_sharding is None:
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding), tree)


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
  *,
  model_config,
  cfg,
  with_entropy=False,
  token_temp=None,
  layer_grads=None,
):
  """Log-probs of one micro-batch's response tokens: packed rows tokens / attn [mb, L] and their
  turns' response starts [mb, T] -> [mb, T, R] (R = resp_len), and with with_entropy the
  entropies [mb, T, R] as well, at cfg.temperature (or the per-token token_temp [mb, T, R]),
  the vocabulary projected cfg.vocab_chunk columns at a time (rl/packing.py). layer_grads: the
  fused gradient accumulator of the layers (model/grad_accum.py), or None."""
  return packed_response_logprobs(
    params,
    model_config,
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


def no_grad_logprobs(
  params,
  tokens_c,
  attn_c,
  starts_c,
  resp_len,
  keep_c,
  temp_c=None,
  *,
  model_config,
  cfg,
  batch_sharding=None,
):
  """Log-probs without gradient of one whole view, micro-batch by micro-batch: chunks tokens_c /
  attn_c [n_chunks, mb, L], starts_c [n_chunks, mb, T] (and per-token temperatures temp_c
  [n_chunks, mb, T, R]) -> [n_chunks, mb, T, R], chunk_logprobs of the chunks with keep_c
  [n_chunks] true (those holding response tokens), zeros for the others, which are not
  forwarded. Serves the old log-probs (docs/method.md §4) and the reference policy's."""
  params = jax.lax.stop_gradient(params)
  logp = functools.partial(chunk_logprobs, model_config=model_config, cfg=cfg)
  if temp_c is None:
    return _map_nonempty(
      lambda x: logp(params, *constrain(x, batch_sharding), resp_len),
      (tokens_c, attn_c, starts_c),
      keep_c,
    )
  return _map_nonempty(
    lambda x: logp(params, *constrain(x[:3], batch_sharding), resp_len, token_temp=x[3]),
    (tokens_c, attn_c, starts_c, temp_c),
    keep_c,
  )


def minibatch_loss(params, d, token_denom, seq_denom, layer_grads=None, *, model_config, cfg):
  """The policy loss (docs/method.md §5; cfg.loss.policy_loss) of one micro-batch d, leaves [mb,
  ...]: cur_tokens / cur_attn [mb, L], cur_starts [mb, T], old_logp / mask (the low-prob-masked
  response mask) / resp_mask [mb, T, R], advantages [mb, T], and where present
  token_temperature [mb, T, R], shaping_gamma [mb, T], ref_logp [mb, T, R]. Its turns are read
  as mb * T samples, summed over the mini-batch denominators token_denom / seq_denom (scalars),
  so micro-batch losses add up to the mini-batch's. Returns (scalar loss, metrics): the loss's
  metrics and the _diff_ sums of |log-prob - old log-prob| over every real response token."""
  lcfg = cfg.loss
  resp_len = d["mask"].shape[-1]
  logp, ent = chunk_logprobs(
    params,
    d["cur_tokens"],
    d["cur_attn"],
    d["cur_starts"],
    resp_len,
    model_config=model_config,
    cfg=cfg,
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
  loss, met = get_policy_loss(lcfg.policy_loss)(
    flat(logp),
    flat(d["old_logp"]),
    flat(d["advantages"]),
    flat(d["mask"]),
    lcfg,
    entropy_br=flat(ent),
    ref_logp_br=flat(d.get("ref_logp")),
    shaping_gamma_br=flat(gamma),
    token_denom=token_denom,
    seq_denom=seq_denom,
  )
  return loss, {**met, **diff_met}


def _rest_loss(rest, acc, *, layers, d, token_denom, seq_denom, model_config, cfg):
  """minibatch_loss as a function of the params but the layers (`rest`) and the layers'
  gradient accumulator `acc`, the layers themselves held fixed (micro_batch_grads, fused)."""
  params = {**rest, "layers": layers}
  return minibatch_loss(params, d, token_denom, seq_denom, acc, model_config=model_config, cfg=cfg)


def micro_batch_grads(params, d, grads, token_denom, seq_denom, *, model_config, cfg, fuse):
  """One micro-batch's contribution to its mini-batch's gradient: d (leaves [mb, ...], as
  minibatch_loss reads them) -> (grads + the gradient of minibatch_loss over `params`, the loss's
  metrics); grads is the float32 accumulator, a params-shaped tree. With `fuse` the layers'
  gradient goes straight into grads["layers"] (the cotangent of layer_grads is layer_grads + this
  micro-batch's layer gradient, model/grad_accum.py: no second params-sized buffer for the
  layers); the rest (embedding, final norm, lm head) is summed as usual."""
  if fuse:
    layers = params["layers"]
    rest = {k: v for k, v in params.items() if k != "layers"}
    rest_loss = functools.partial(
      _rest_loss,
      layers=layers,
      d=d,
      token_denom=token_denom,
      seq_denom=seq_denom,
      model_config=model_config,
      cfg=cfg,
    )
    fused_grad = jax.value_and_grad(rest_loss, argnums=(0, 1), has_aux=True)
    (_, met), (g_rest, acc) = fused_grad(rest, grads["layers"])
    return {**_add({k: grads[k] for k in g_rest}, g_rest), "layers": acc}, met
  loss_fn = functools.partial(minibatch_loss, model_config=model_config, cfg=cfg)
  (_, met), g = jax.value_and_grad(loss_fn, has_aux=True)(params, d, token_denom, seq_denom)
  return _add(grads, g), met


def _accumulate(
  j, carry, *, params, d, token_denom, seq_denom, model_config, cfg, fuse, batch_sharding
):
  """Loop body of minibatch_step: micro-batch j of d ([n_micro, mb, ...] leaves) added into the
  carry (float32 gradient accumulator, summed metrics)."""
  grads, met_sum = carry
  dj = constrain(_index(d, j), batch_sharding)
  grads, met = micro_batch_grads(
    params, dj, grads, token_denom, seq_denom, model_config=model_config, cfg=cfg, fuse=fuse
  )
  return grads, _combine(met_sum, met)


def minibatch_step(state, d, *, model_config, cfg, optimizer, fuse, batch_sharding=None):
  """One optimizer step on one mini-batch slot (docs/method.md §1 item 5): d holds the slot's
  micro-batches, leaves [n_micro, mb, ...] (as minibatch_loss reads them). The gradients of the
  micro-batches with response tokens are summed in float32 (the loss denominators are the slot's
  own token / sequence counts, so accumulation equals one large batch; an empty micro-batch adds
  exactly zero and is skipped), then `optimizer` (global-norm clipping + AdamW) takes one step.
  Returns (state with new params, opt_state and step + 1, metrics): the loss metrics summed over
  the micro-batches (a max for *_max), grad_norm and update_norm (||the parameter change||)."""
  mask = d["mask"]
  token_denom = jnp.sum(mask)
  seq_denom = jnp.sum(jnp.any(mask > 0, axis=-1))
  settings = {"model_config": model_config, "cfg": cfg}
  met_shape = jax.eval_shape(
    lambda: minibatch_loss(state.params, _index(d, 0), token_denom, seq_denom, **settings)[1]
  )
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
  met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), met_shape)
  micro = functools.partial(
    _accumulate,
    params=state.params,
    d=d,
    token_denom=token_denom,
    seq_denom=seq_denom,
    fuse=fuse,
    batch_sharding=batch_sharding,
    **settings,
  )
  # A micro-batch without response tokens adds exactly zero to every sum: skipped.
  grads, met = _nonempty_loop(_any_after_first(mask > 0), micro, (zeros, met0))
  met["grad_norm"] = optax.global_norm(grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  # This step's parameter change, from the update itself: no copy of the pre-update params
  # is held (it cost a params-sized buffer: 0.5 GiB for SmolLM2, 7.1 GiB a chip for 7B).
  met["update_norm"] = optax.global_norm(updates)
  params = optax.apply_updates(state.params, updates)
  return state._replace(params=params, opt_state=opt_state, step=state.step + 1), met


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
  used += tuple(k for k in OPTIONAL_KEYS if k in batch)
  return {k: to_chunks(batch[k], n_chunks) for k in used}, n_rows // slot_rows


def view_logprobs(params, ch, view, has_tokens_c, model_config, cfg, batch_sharding):
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
    model_config=model_config,
    cfg=cfg,
    batch_sharding=batch_sharding,
  )


def old_logprobs(
  params,
  ch,
  sampler_logp,
  has_tokens_c,
  old_from_sampler=None,
  *,
  model_config,
  cfg,
  batch_sharding=None,
):
  """The old log-probs of every row (docs/method.md §4), [n_chunks, mb, T, R], and use_sampler
  (bool scalar: they are the sampler's). Recomputed by no_grad_logprobs over the old view of the
  chunks ch (chunk_batch) that have response tokens (has_tokens_c [n_chunks]), or, with
  cfg.old_logprobs == "sampler" and old_from_sampler true (None: true), the sampler's log-probs
  sampler_logp [B, T, R] in chunks, with no forward pass; in "sampler" mode one program serves
  both (lax.cond runs only the branch taken)."""
  n_chunks = ch["old_tokens"].shape[0]
  recompute = functools.partial(
    view_logprobs, params, ch, "old", has_tokens_c, model_config, cfg, batch_sharding
  )
  if cfg.old_logprobs == "sampler":
    use_sampler = jnp.asarray(True if old_from_sampler is None else old_from_sampler, jnp.bool_)
    # One program for both: lax.cond runs only the branch taken.
    old_logp = jax.lax.cond(use_sampler, lambda: to_chunks(sampler_logp, n_chunks), recompute)
  else:
    use_sampler = jnp.asarray(False)
    old_logp = recompute()
  return old_logp, use_sampler


def old_view_stats(full_mask, old_flat, sampler_logp, use_sampler, loss_cfg):
  """The low-probability sample mask (docs/method.md §5) and the old view's batch-level figures:
  full_mask (response mask), old_flat (old log-probs) and sampler_logp, [B, T, R] each, and
  use_sampler (bool scalar) -> (mask [B, T, R]: full_mask with the masked turn samples zeroed,
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
    "old_from_sampler": use_sampler.astype(jnp.float32),
    "per_sample": per_sample_stats(full_mask, old_flat, masked_b.reshape(full_mask.shape[:2])),
  }
  return mask, metrics, batch_diff, n_tok


def minibatch_data(
  ch,
  old_logp,
  mask,
  has_tokens_c,
  n_slots,
  ref_params=None,
  *,
  model_config,
  cfg,
  batch_sharding=None,
):
  """What the loss reads, in mini-batch slots: from the chunks ch (chunk_batch), the old
  log-probs old_logp [n_chunks, mb, T, R] and the low-prob-masked response mask [B, T, R] ->
  (data, has_samples_s). data: leaves [n_slots, n_micro, mb, ...]: the cur view, old_logp,
  advantages, mask, resp_mask, the optional keys present, and with cfg.loss.kl_coef the
  reference policy's log-probs of the cur view (no_grad_logprobs of ref_params over the chunks
  with has_tokens_c; ValueError without ref_params). has_samples_s [n_slots]: the slots holding
  real samples (sample_index >= 0)."""
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
  for k in OPTIONAL_KEYS:
    if k in ch:
      data[k] = ch[k]
  if cfg.loss.kl_coef:
    if ref_params is None:
      raise ValueError("LossConfig.kl_coef > 0: pass ref_params to the update")
    data["ref_logp"] = view_logprobs(
      ref_params, ch, "cur", has_tokens_c, model_config, cfg, batch_sharding
    )
  # [n_chunks, mb, ...] -> [n_slots, n_micro, mb, ...]
  split = lambda x: x.reshape((n_slots, n_chunks // n_slots) + x.shape[1:])  # noqa: E731
  data = jax.tree.map(split, data)
  # A slot with real samples takes a step even if the low-prob mask emptied it (as verl's
  # optimizer.step() does: AdamW momentum and weight decay still apply).
  return data, _any_after_first(split(ch["sample_index"]) >= 0)


def _slot_step(k, carry, *, data, step_fn):
  """Loop body of run_epochs: slot k's optimizer step (step_fn: minibatch_step with its settings
  bound); the step metrics combined into the carry's sums, the _diff_ sums kept from the
  first step taken only."""
  state, met_sum, first, n_done = carry
  state, met = step_fn(state, _index(data, k))
  diff = {key: met.pop(key) for key in _DIFF_KEYS}  # kept for the first step only
  first = jax.tree.map(lambda a, b: jnp.where(n_done == 0, b, a), first, diff)
  return state, _combine(met_sum, met), first, n_done + 1


def _epoch(_, carry, *, has_samples_s, slot_step):
  """Loop body of run_epochs: one PPO epoch, slot_step over the slots with samples, in order."""
  return _nonempty_loop(has_samples_s, slot_step, carry)


def run_epochs(
  state, data, has_samples_s, *, model_config, cfg, optimizer, fuse, batch_sharding=None
):
  """The PPO epochs (docs/method.md §1 item 5): cfg.epochs passes over the mini-batch slots of
  data (minibatch_data: leaves [n_slots, n_micro, mb, ...]) with has_samples_s [n_slots], one
  minibatch_step per slot with samples, in order (after the first step the policy has moved, so
  later ratios leave 1). Returns (state, met_sum: the step metrics summed over the steps taken,
  a max for *_max, first: the first step's _diff_sum, _diff_n and _diff_max)."""
  step_fn = functools.partial(
    minibatch_step,
    model_config=model_config,
    cfg=cfg,
    optimizer=optimizer,
    fuse=fuse,
    batch_sharding=batch_sharding,
  )
  met_shape = jax.eval_shape(lambda s: step_fn(s, _index(data, 0))[1], state)
  met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), met_shape)
  first0 = {k: met0.pop(k) for k in _DIFF_KEYS}
  slot_step = functools.partial(_slot_step, data=data, step_fn=step_fn)
  epoch = functools.partial(_epoch, has_samples_s=has_samples_s, slot_step=slot_step)
  carry0 = (state, met0, first0, jnp.zeros((), jnp.int32))
  state, met_sum, first, _ = jax.lax.fori_loop(0, cfg.epochs, epoch, carry0)
  return state, met_sum, first


def finish_metrics(
  met_sum, first, view_metrics, batch_diff, n_tok, use_sampler, has_samples_s, epochs
):
  """The update's metrics (rl/update.make_update_fn's docstring) from run_epochs' met_sum and
  first, old_view_stats' view_metrics, batch_diff [B, T, R] and n_tok, use_sampler and
  has_samples_s [n_slots]: the step metrics averaged over the epochs * (slots with samples)
  optimizer steps (ratio_max: their max), optim_steps, the view metrics, and
  sampler_vs_old_logp_absdiff / _maxdiff over the whole batch when the old log-probs were
  recomputed, else over the first step's forward pass (unchanged weights, so its log-probs are
  the recomputed old ones)."""
  absdiff = jnp.where(
    use_sampler,
    first["_diff_sum"] / jnp.maximum(first["_diff_n"], 1),
    jnp.sum(batch_diff) / n_tok,
  )
  maxdiff = jnp.where(use_sampler, first["_diff_max"], jnp.max(batch_diff))
  steps = epochs * jnp.sum(has_samples_s.astype(jnp.int32))
  met = {k: (v if k == "ratio_max" else v / jnp.maximum(steps, 1)) for k, v in met_sum.items()}
  met["optim_steps"] = steps
  met.update(view_metrics)
  met["sampler_vs_old_logp_absdiff"] = absdiff
  met["sampler_vs_old_logp_maxdiff"] = maxdiff
  return met


def update(
  state,
  batch,
  ref_params=None,
  old_from_sampler=None,
  *,
  model_config,
  cfg,
  optimizer,
  fuse,
  batch_sharding=None,
):
  """One whole update (rl/update.py's docstring): the state and a batch (rl/batch.build_batch
  rows [B, ...] or packed rows with turns [B, T, ...], laid out by rl/minibatch.arrange), the
  reference params with cfg.loss.kl_coef, old_from_sampler (bool scalar or None; "sampler" mode)
  -> (state after the optimizer steps, metrics: finish_metrics). rl/update.make_update_fn binds
  the keyword arguments and jits this."""
  batch = as_packed(batch)
  settings = {"model_config": model_config, "cfg": cfg, "batch_sharding": batch_sharding}
  ch, n_slots = chunk_batch(batch, cfg)
  has_tokens_c = _any_after_first(ch["response_mask"] > 0)  # [n_chunks]
  full_mask = batch["response_mask"]  # [B, T, R]
  sampler_logp = jnp.where(full_mask > 0, batch["sampler_logp"], 0.0).astype(jnp.float32)
  old_logp, use_sampler = old_logprobs(
    state.params, ch, sampler_logp, has_tokens_c, old_from_sampler, **settings
  )
  mask, view_metrics, batch_diff, n_tok = old_view_stats(
    full_mask, from_chunks(old_logp), sampler_logp, use_sampler, cfg.loss
  )
  data, has_samples_s = minibatch_data(
    ch, old_logp, mask, has_tokens_c, n_slots, ref_params, **settings
  )
  state, met_sum, first = run_epochs(
    state, data, has_samples_s, optimizer=optimizer, fuse=fuse, **settings
  )
  return state, finish_metrics(
    met_sum, first, view_metrics, batch_diff, n_tok, use_sampler, has_samples_s, cfg.epochs
  )
