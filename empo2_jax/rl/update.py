"""The EMPO2 update as one jitted function: old log-probs, low-prob mask, PPO mini-batches.

    batch = rl.minibatch.arrange(batch, cfg, seed=(config.seed, iteration))  # shuffled layout
    state, metrics = update_fn(state, batch)            # batch from rl/batch.build_batch
    state, metrics = update_fn(state, batch, ref_params)  # with LossConfig.kl_coef > 0

Inside one call:
  1. old log-probs of the "old" view for every row, in micro-batches, without gradient
     (docs/method.md §4: the trainer recomputes them, so the ratio starts at 1 when both views
     agree), or, with UpdateConfig.old_logprobs="sampler" and old_from_sampler true, the batch's
     `sampler_logp` taken as they are (no forward pass; see "Old log-probs from the sampler" below);
  2. the low-probability sample mask from those old log-probs (docs/method.md §5);
  3. for each PPO epoch and each mini-batch holding samples: gradients summed over its
     micro-batches (loss denominators are that mini-batch's own token / sequence counts, so
     accumulation equals one large batch), then one optax step (global-norm clipping + AdamW).
     After the first step the policy has moved, so the ratio of later mini-batches leaves 1 and
     clipping acts (docs/method.md §1 item 5: verl's mini-batches of 128 turn samples, 1 epoch).

Row layout. The B rows are S mini-batch slots of M = min(cfg.minibatch_rows, B) rows each, M a
multiple of micro_rows. Rows are assigned to micro-batches with a stride: row b goes to chunk
b % (B // micro_rows), and slot k is chunks [k * M/micro_rows, (k+1) * M/micro_rows). With the
batch sharded over its row axis, every micro-batch is then spread evenly over all devices and the
reshape is local. rl/minibatch.arrange builds this layout from build_batch's rows (shuffled).

Shapes stay static, counts are dynamic: a slot without real samples (sample_index < 0 on all its
rows) takes no optimizer step, and a chunk without response tokens is neither forwarded nor
differentiated (loops run over the non-empty ones only, in a while loop of dynamic trip count).
So padding rows cost no compute, and the jitted update compiles once per (B, L) shape.

Old log-probs from the sampler. The sampler returns each sampled token's log-prob under the
weights the update starts from; where the old view is exactly the token sequence the sampler saw
(modes 'on' and 'on_tips', and 'off' with ratio_variant 'release'), at the update's temperature,
without top-k/top-p, in the same dtype, those ARE the old log-probs up to floating-point
reassociation (sampler: chunked prefill + per-token decode against a KV cache; update: one forward
over the packed row). On SmolLM2-135M-Instruct in fp32 at temperature 1 the two differ by at most
3.1e-5 nats over 500 sampled response tokens (tests/test_old_logprobs.py; SAMPLER_LOGP_TOL =
1e-3 is the tolerance). With cfg.old_logprobs="sampler" the update takes a dynamic flag
`old_from_sampler` (bool scalar; None = True): true skips the old-view forward pass (one of the
~5 forward-equivalents a trained token costs), false recomputes as above; one compiled program
serves both (lax.cond), so an off-policy iteration costs no extra compile. Which iterations may
pass true is the trainer's decision (train/settings.old_logprobs_from_sampler,
train/trainer.py). The low-probability mask then reads the sampler's log-probs (a token within
1e-3 of the delta threshold may flip; none in the measured batches).

Precision: params are fp32 master weights (and so are the AdamW moments and the gradients); the
model casts each weight to `compute_dtype` where it is used, so with compute_dtype=bfloat16 the
matmuls run in bf16 from the fp32 masters inside the jitted step. bf16 storage is refused:
one lr-1e-6 step is ~1% of a bf16 ulp at |w| = 0.02 and rounds away.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from empo2_jax.parallel.sharding import on_mesh
from empo2_jax.rl.logprobs import response_logprobs
from empo2_jax.rl.losses import LossConfig, apply_low_prob_mask, get_policy_loss
from empo2_jax.rl.packing import packed_response_logprobs

MASTER_DTYPE = "float32"
# The batch's optional per-turn inputs (rl/batch.py; present when some turn has them): each
# response token's sampling temperature [B, T, R] (0: UpdateConfig.temperature), read by the
# log-probs as 1/T per token, and the policy-shaping constant [B, T] (0: the clipped surrogate),
# read by the loss (rl/losses.policy_loss, shaping_gamma_br).
OPTIONAL_KEYS = ("token_temperature", "shaping_gamma")
OLD_LOGPROBS = ("recompute", "sampler")
# The largest |sampler_logp - recomputed old_logp| (nats, over real response tokens) accepted
# when the update takes the sampler's log-probs as old log-probs: measured 3.1e-5 on
# SmolLM2-135M-Instruct in fp32 at temperature 1 (tests/test_old_logprobs.py), ~30x margin.
SAMPLER_LOGP_TOL = 1e-3
# Per-step sums of the first mini-batch's |log-prob - old log-prob| (the sampler-vs-recompute
# check when the old log-probs come from the sampler): kept out of the averaged step metrics.
_DIFF_KEYS = ("_diff_sum", "_diff_n", "_diff_max")


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateConfig:
  """The update's settings under the config's own names (empo2_jax/defaults.py; built by name in
  train/settings.update_config): the `optim` keys it reads, rollout.temperature and the `loss`
  section. Only the settings the config does not hold have defaults."""

  lr: float
  weight_decay: float
  b1: float  # AdamW beta1
  b2: float  # AdamW beta2
  grad_clip: float  # global-norm gradient clip
  minibatch_size: int  # turn samples per optimizer step (verl: 16 rows x 8 rollouts)
  micro_rows: int  # rows per forward/backward (gradient accumulation unit)
  epochs: int  # PPO epochs over the batch
  temperature: float  # rollout.temperature: the sampler's training temperature
  # "recompute": old log-probs by a no-grad forward pass of the old view; "sampler": the batch's
  # sampler_logp where the caller says they are valid (old_from_sampler; module docstring).
  old_logprobs: str
  loss: LossConfig
  eps: float = 1e-8  # AdamW epsilon
  vocab_chunk: int = 8192  # vocabulary columns per log-prob chunk (rl/logprobs.py)

  def __post_init__(self):
    if self.old_logprobs not in OLD_LOGPROBS:
      raise ValueError(f"UpdateConfig.old_logprobs must be one of {OLD_LOGPROBS}")
    for name in ("minibatch_size", "micro_rows", "epochs", "vocab_chunk"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"UpdateConfig.{name} must be >= 1, got {getattr(self, name)}")

  @property
  def minibatch_rows(self) -> int:
    """Rows of one mini-batch slot: minibatch_size rounded up to a multiple of micro_rows."""
    return -(-self.minibatch_size // self.micro_rows) * self.micro_rows


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: optimizer steps taken


def make_optimizer(cfg) -> optax.GradientTransformation:
  """Global-norm clipping + AdamW from cfg's grad_clip, lr, b1, b2, eps and weight_decay (the
  config's names; any settings object with them). The moments take the params' dtype: fp32 with
  fp32 masters."""
  return optax.chain(
    optax.clip_by_global_norm(cfg.grad_clip),
    optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
  )


def init_train_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def check_master_dtype(model_config) -> None:
  """The update trains fp32 master weights; anything else cannot take an lr-1e-6 step."""
  if model_config.param_dtype != MASTER_DTYPE:
    raise ValueError(
      f"model param_dtype={model_config.param_dtype!r}: the update keeps {MASTER_DTYPE} master "
      "weights (and AdamW moments). In bfloat16 storage an lr-1e-6 AdamW step is far below "
      "half an ulp of a typical weight and rounds back to the old value, so nothing would be "
      "learned. Use param_dtype='float32' with compute_dtype='bfloat16' (bf16 matmuls from "
      "fp32 masters)."
    )


def _to_chunks(x, n_chunks):
  """[B, ...] -> [n_chunks, B // n_chunks, ...] with row b in chunk b % n_chunks."""
  rows = x.shape[0] // n_chunks
  return jnp.swapaxes(x.reshape((rows, n_chunks) + x.shape[1:]), 0, 1)


def _from_chunks(x):
  """Inverse of _to_chunks."""
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


def make_update_fn(
  model_config,
  cfg: UpdateConfig,
  optimizer=None,
  *,
  batch_sharding=None,
  state_sharding=None,
  donate: bool = True,
  fuse_layer_grads: Optional[bool] = None,
):
  """Returns jitted update(state, batch[, ref_params]) -> (state, metrics).

  fuse_layer_grads (default: wherever the model allows it, i.e. scanned layers with full remat):
  the micro-batches' backward adds the layers' gradient into the accumulator layer by layer
  (model/grad_accum.py) instead of materialising each micro-batch's whole gradient and adding it:
  the same sums, without a second params-sized buffer for the layers.

  Params and batch may be placed with any sharding (jit follows them); `state_sharding` (a
  TrainState-shaped tree of shardings) pins the output state to the same layout (needed for the
  donated buffers to be reused when compiling ahead of time). `batch_sharding` (e.g.
  parallel.sharding.batch_sharding(mesh)) constrains every micro-batch along its row axis.

  metrics: the per-step loss metrics (loss, pg_loss, clipfrac_*, ratio_mean, approx_kl, entropy,
  grad_norm, update_norm = ||the step's parameter change|| (global norm), ...) averaged over the
  optimizer steps taken (ratio_max: their max); optim_steps; masked_frac,
  old_logp_mean, n_tokens over the whole batch; per_sample, a dict of [B, T] arrays (B, T = 1
  for a one-row-per-turn batch) from per_sample_stats (the only non-scalar entry);
  old_from_sampler (1.0: the old log-probs were the sampler's); sampler_vs_old_logp_absdiff /
  _maxdiff, the mean / max over real response tokens of |sampler_logp - recomputed old_logp|:
  over the whole batch when the old log-probs were recomputed, over the first mini-batch when
  they came from the sampler (its first forward pass
  runs on the unchanged weights, so its log-probs are the recomputed old ones, for free).
  """
  check_master_dtype(model_config)
  optimizer = optimizer or make_optimizer(cfg)
  lcfg = cfg.loss

  def constrain(tree):
    if batch_sharding is None:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding), tree)

  def inv_temperature(token_temp):
    """[.., R] per-token temperatures (0: the training temperature) -> 1/tau, or None."""
    if token_temp is None:
      return None
    return jnp.where(token_temp > 0, 1.0 / jnp.maximum(token_temp, 1e-6), 1.0 / cfg.temperature)

  fusable = getattr(model_config, "scan_layers", False) and model_config.remat == "full"
  if fuse_layer_grads and not fusable:
    raise ValueError(
      "fuse_layer_grads needs scanned layers with full remat; got "
      f"scan_layers={getattr(model_config, 'scan_layers', None)}, remat={model_config.remat!r}"
    )
  fuse = fusable if fuse_layer_grads is None else fuse_layer_grads

  def logp_fn(
    params, tokens, attn, starts, resp_len, with_entropy=False, token_temp=None, layer_grads=None
  ):
    """[mb, L] rows, [mb, T] turn starts -> [mb, T, R] (and entropy)."""
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
      inv_temperature=inv_temperature(token_temp),
      layer_grads=layer_grads,
    )

  def no_grad_logp(params, tokens_c, attn_c, starts_c, resp_len, keep_c, temp_c=None):
    """[n_chunks, mb, L] -> [n_chunks, mb, T, R] (zeros on chunks without response tokens)."""
    params = jax.lax.stop_gradient(params)
    if temp_c is None:
      return _map_nonempty(
        lambda x: logp_fn(params, *constrain(x), resp_len), (tokens_c, attn_c, starts_c), keep_c
      )
    return _map_nonempty(
      lambda x: logp_fn(params, *constrain(x[:3]), resp_len, token_temp=x[3]),
      (tokens_c, attn_c, starts_c, temp_c),
      keep_c,
    )

  def loss_fn(params, d, token_denom, seq_denom, layer_grads=None):
    resp_len = d["mask"].shape[-1]
    logp, ent = logp_fn(
      params,
      d["cur_tokens"],
      d["cur_attn"],
      d["cur_starts"],
      resp_len,
      True,
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

  def minibatch_step(state: TrainState, d):
    """d: leaves [n_micro, mb, ...] -> one optimizer step and its metrics."""
    mask = d["mask"]
    token_denom = jnp.sum(mask)
    seq_denom = jnp.sum(jnp.any(mask > 0, axis=-1))
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    met_shape = jax.eval_shape(
      lambda: grad_fn(state.params, _index(d, 0), token_denom, seq_denom)[0][1]
    )

    def add(total, g):  # into the float32 accumulator
      return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), total, g)

    def micro(j, carry):
      grads, met_sum = carry
      dj = constrain(_index(d, j))
      if fuse:
        # The layers' gradient goes straight into the accumulator (the cotangent of
        # layer_grads is layer_grads + this micro-batch's layer gradient); the rest (embedding,
        # final norm, lm head) is summed as usual.
        layers = state.params["layers"]

        def rest_loss(rest, acc):
          return loss_fn({**rest, "layers": layers}, dj, token_denom, seq_denom, acc)

        rest = {k: v for k, v in state.params.items() if k != "layers"}
        fused_grad = jax.value_and_grad(rest_loss, argnums=(0, 1), has_aux=True)
        (_, met), (g_rest, acc) = fused_grad(rest, grads["layers"])
        grads = {**add({k: grads[k] for k in g_rest}, g_rest), "layers": acc}
      else:
        (_, met), g = grad_fn(state.params, dj, token_denom, seq_denom)
        grads = add(grads, g)
      return grads, _combine(met_sum, met)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), met_shape)
    # A micro-batch without response tokens adds exactly zero to every sum: skipped.
    grads, met = _nonempty_loop(_any_after_first(mask > 0), micro, (zeros, met0))
    met["grad_norm"] = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    # This step's parameter change, from the update itself: no copy of the pre-update params
    # is held (it cost a params-sized buffer: 0.5 GiB for SmolLM2, 7.1 GiB a chip for 7B).
    met["update_norm"] = optax.global_norm(updates)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params, opt_state, state.step + 1), met

  def update(state: TrainState, batch, ref_params=None, old_from_sampler=None):
    batch = as_packed(batch)
    n_rows, _, resp_len = batch["response_mask"].shape
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
    n_slots = n_rows // slot_rows
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
    ch = {k: _to_chunks(batch[k], n_chunks) for k in used}
    temp_c = ch.get("token_temperature")
    has_tokens_c = _any_after_first(ch["response_mask"] > 0)  # [n_chunks]
    full_mask = batch["response_mask"]  # [B, T, R]
    sampler_logp = jnp.where(full_mask > 0, batch["sampler_logp"], 0.0).astype(jnp.float32)

    def recompute():
      return no_grad_logp(
        state.params,
        ch["old_tokens"],
        ch["old_attn"],
        ch["old_starts"],
        resp_len,
        has_tokens_c,
        temp_c,
      )

    if cfg.old_logprobs == "sampler":
      use_sampler = jnp.asarray(True if old_from_sampler is None else old_from_sampler, jnp.bool_)
      # One program for both: lax.cond runs only the branch taken.
      old_logp = jax.lax.cond(use_sampler, lambda: _to_chunks(sampler_logp, n_chunks), recompute)
    else:
      use_sampler = jnp.asarray(False)
      old_logp = recompute()

    old_flat = _from_chunks(old_logp)
    turns = lambda x: x.reshape((-1, resp_len))  # noqa: E731  [B*T, R]: one turn sample a row
    mask, masked_b = apply_low_prob_mask(turns(full_mask), turns(old_flat), lcfg)
    mask = mask.reshape(full_mask.shape)
    n_with_tokens = jnp.maximum(jnp.sum(jnp.any(full_mask > 0, axis=-1)), 1)
    n_tok = jnp.maximum(jnp.sum(full_mask), 1)
    batch_diff = jnp.where(full_mask > 0, jnp.abs(sampler_logp - old_flat), 0.0)
    pre = {
      "masked_frac": jnp.sum(masked_b) / n_with_tokens,
      "old_logp_mean": jnp.sum(jnp.where(full_mask > 0, old_flat, 0.0)) / n_tok,
      "n_tokens": jnp.sum(mask),
      "old_from_sampler": use_sampler.astype(jnp.float32),
      "per_sample": per_sample_stats(full_mask, old_flat, masked_b.reshape(full_mask.shape[:2])),
    }
    data = {
      "cur_tokens": ch["cur_tokens"],
      "cur_attn": ch["cur_attn"],
      "cur_starts": ch["cur_starts"],
      "old_logp": old_logp,
      "advantages": ch["advantages"],
      "mask": _to_chunks(mask, n_chunks),
      "resp_mask": ch["response_mask"],
    }
    for k in OPTIONAL_KEYS:
      if k in ch:
        data[k] = ch[k]
    if lcfg.kl_coef:
      if ref_params is None:
        raise ValueError("LossConfig.kl_coef > 0: pass ref_params to the update")
      data["ref_logp"] = no_grad_logp(
        ref_params,
        ch["cur_tokens"],
        ch["cur_attn"],
        ch["cur_starts"],
        resp_len,
        has_tokens_c,
        temp_c,
      )
    # [n_chunks, mb, ...] -> [n_slots, n_micro, mb, ...]
    split = lambda x: x.reshape((n_slots, n_chunks // n_slots) + x.shape[1:])  # noqa: E731
    data = jax.tree.map(split, data)
    # A slot with real samples takes a step even if the low-prob mask emptied it (as verl's
    # optimizer.step() does: AdamW momentum and weight decay still apply).
    has_samples_s = _any_after_first(split(ch["sample_index"]) >= 0)  # [n_slots]

    met_shape = jax.eval_shape(lambda s: minibatch_step(s, _index(data, 0))[1], state)
    met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), met_shape)
    first0 = {k: met0.pop(k) for k in _DIFF_KEYS}

    def step(k, carry):
      state, met_sum, first, n_done = carry
      state, met = minibatch_step(state, _index(data, k))
      diff = {key: met.pop(key) for key in _DIFF_KEYS}  # kept for the first step only
      first = jax.tree.map(lambda a, b: jnp.where(n_done == 0, b, a), first, diff)
      return state, _combine(met_sum, met), first, n_done + 1

    def epoch(_, carry):
      return _nonempty_loop(has_samples_s, step, carry)

    carry0 = (state, met0, first0, jnp.zeros((), jnp.int32))
    state, met_sum, first, _ = jax.lax.fori_loop(0, cfg.epochs, epoch, carry0)
    # sampler vs recomputed old log-probs: the whole batch when recomputed, else the first step's
    # forward pass (unchanged weights, so its log-probs are the recomputed old ones).
    pre["sampler_vs_old_logp_absdiff"] = jnp.where(
      use_sampler,
      first["_diff_sum"] / jnp.maximum(first["_diff_n"], 1),
      jnp.sum(batch_diff) / n_tok,
    )
    pre["sampler_vs_old_logp_maxdiff"] = jnp.where(
      use_sampler, first["_diff_max"], jnp.max(batch_diff)
    )
    steps = cfg.epochs * jnp.sum(has_samples_s.astype(jnp.int32))
    met = {k: (v if k == "ratio_max" else v / jnp.maximum(steps, 1)) for k, v in met_sum.items()}
    met["optim_steps"] = steps
    met.update(pre)
    return state, met

  jit_kw: dict[str, Any] = {"donate_argnums": (0,) if donate else ()}
  if state_sharding is not None:  # inputs keep the shardings they were placed with
    jit_kw["out_shardings"] = (state_sharding, None)
  if batch_sharding is not None:  # the model pins its activations' rows on this mesh
    update = on_mesh(update, batch_sharding.mesh)
  return jax.jit(update, **jit_kw)


def sample_logprobs_fn(model_config, cfg: UpdateConfig):
  """Jitted (params, tokens [B, L], attn [B, L], R) -> log-probs [B, R] of the last R columns
  (rl/batch.build_batch rows: the response right-aligned), in micro-batches of cfg.micro_rows rows
  (B a multiple of it), at cfg.temperature: the reference the tests hold the update's old
  log-probs and the sampler's against."""
  rows = cfg.micro_rows

  def f(params, tokens, attn, resp_len):
    n_chunks = tokens.shape[0] // rows
    out = jax.lax.map(
      lambda ta: response_logprobs(
        params,
        model_config,
        ta[0],
        ta[1],
        resp_len,
        temperature=cfg.temperature,
        chunk_size=cfg.vocab_chunk,
      ),
      (_to_chunks(tokens, n_chunks), _to_chunks(attn, n_chunks)),
    )
    return _from_chunks(out)

  return jax.jit(f, static_argnums=(3,))
