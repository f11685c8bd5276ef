"""The EMPO2 update as one jitted function: old log-probs, low-prob mask, PPO mini-batches.

    state, metrics = update_fn(state, batch)            # batch from rl/batch.build_batch
    state, metrics = update_fn(state, batch, ref_params)  # with LossConfig.kl_coef > 0

Inside one call:
  1. old log-probs of the "old" view for every row, in micro-batches, without gradient (SPEC §4:
     the trainer recomputes them, so the ratio starts at 1 when both views agree);
  2. the low-probability sample mask from those old log-probs (SPEC §5);
  3. for each PPO epoch and each mini-batch: gradients summed over micro-batches (loss
     denominators are the mini-batch's token / sequence counts, so accumulation equals one large
     batch), then one optax step (global-norm clipping + AdamW).

Rows are assigned to micro-batches with a stride: row b goes to chunk b % n_chunks. With the batch
sharded over its row axis, every micro-batch is then spread evenly over all devices and the
reshape is local. Mini-batch k is chunks [k*n_micro, (k+1)*n_micro).
B must be a multiple of num_minibatches * micro_rows (set BatchConfig.row_multiple to it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from empo2_jax.rl.logprobs import response_logprobs
from empo2_jax.rl.losses import LossConfig, apply_low_prob_mask, policy_loss


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  learning_rate: float = 1e-6
  weight_decay: float = 0.01
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  adam_eps: float = 1e-8
  max_grad_norm: float = 1.0
  num_minibatches: int = 1  # optimizer steps per epoch
  micro_rows: int = 8  # rows per forward/backward (gradient accumulation unit)
  ppo_epochs: int = 1
  temperature: float = 1.0  # the sampler's training temperature
  vocab_chunk: int = 8192
  loss: LossConfig = LossConfig()


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: optimizer steps taken


def make_optimizer(cfg: UpdateConfig) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(cfg.max_grad_norm),
      optax.adamw(cfg.learning_rate, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                  weight_decay=cfg.weight_decay))


def init_train_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def _to_chunks(x, n_chunks):
  """[B, ...] -> [n_chunks, B // n_chunks, ...] with row b in chunk b % n_chunks."""
  rows = x.shape[0] // n_chunks
  return jnp.swapaxes(x.reshape((rows, n_chunks) + x.shape[1:]), 0, 1)


def _from_chunks(x):
  """Inverse of _to_chunks."""
  x = jnp.swapaxes(x, 0, 1)
  return x.reshape((-1,) + x.shape[2:])


def make_update_fn(model_config, cfg: UpdateConfig, optimizer=None, *, batch_sharding=None,
                   state_sharding=None, donate: bool = True):
  """Returns jitted update(state, batch[, ref_params]) -> (state, metrics).

  Params and batch may be placed with any sharding (jit follows them); `state_sharding` (a
  TrainState-shaped tree of shardings) pins the output state to the same layout (needed for the
  donated buffers to be reused when compiling ahead of time). `batch_sharding` (e.g.
  parallel.sharding.batch_sharding(mesh)) constrains every micro-batch along its row axis.
  """
  optimizer = optimizer or make_optimizer(cfg)
  lcfg = cfg.loss

  def constrain(tree):
    if batch_sharding is None:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding), tree)

  def logp_fn(params, tokens, attn, resp_len, with_entropy=False):
    return response_logprobs(params, model_config, tokens, attn, resp_len,
                             temperature=cfg.temperature, chunk_size=cfg.vocab_chunk,
                             with_entropy=with_entropy)

  def no_grad_logp(params, tokens_c, attn_c, resp_len):
    """[n_chunks, mb, L] -> [n_chunks, mb, R], one micro-batch at a time."""
    params = jax.lax.stop_gradient(params)
    return jax.lax.map(lambda ta: logp_fn(params, *constrain(ta), resp_len), (tokens_c, attn_c))

  def loss_fn(params, d, token_denom, seq_denom):
    logp, ent = logp_fn(params, d["cur_tokens"], d["cur_attn"], d["mask"].shape[1], True)
    return policy_loss(logp, d["old_logp"], d["advantages"], d["mask"], lcfg, entropy_br=ent,
                       ref_logp_br=d.get("ref_logp"), token_denom=token_denom,
                       seq_denom=seq_denom)

  def minibatch_step(state: TrainState, d):
    """d: leaves [n_micro, mb, ...] -> one optimizer step."""
    mask = d["mask"]
    token_denom = jnp.sum(mask)
    seq_denom = jnp.sum(jnp.any(mask > 0, axis=-1))

    def micro(grads, dm):
      (_, met), g = jax.value_and_grad(loss_fn, has_aux=True)(
          state.params, constrain(dm), token_denom, seq_denom)
      return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g), met

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    grads, met = jax.lax.scan(micro, zeros, d)
    met = {k: (jnp.max(v) if k == "ratio_max" else jnp.sum(v)) for k, v in met.items()}
    met["grad_norm"] = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params, opt_state, state.step + 1), met

  def update(state: TrainState, batch, ref_params=None):
    n_rows, resp_len = batch["response_mask"].shape
    n_mb = cfg.num_minibatches
    if n_rows % (n_mb * cfg.micro_rows):
      raise ValueError(f"batch rows {n_rows} must be a multiple of num_minibatches * "
                       f"micro_rows = {n_mb * cfg.micro_rows} (BatchConfig.row_multiple)")
    n_chunks = n_rows // cfg.micro_rows
    used = ("cur_tokens", "cur_attn", "old_tokens", "old_attn", "advantages")
    ch = {k: _to_chunks(batch[k], n_chunks) for k in used}
    old_logp = no_grad_logp(state.params, ch["old_tokens"], ch["old_attn"], resp_len)

    full_mask = batch["response_mask"]
    old_flat = _from_chunks(old_logp)
    mask, masked_b = apply_low_prob_mask(full_mask, old_flat, lcfg)
    n_with_tokens = jnp.maximum(jnp.sum(jnp.any(full_mask > 0, axis=-1)), 1)
    n_tok = jnp.maximum(jnp.sum(full_mask), 1)
    pre = {
        "masked_frac": jnp.sum(masked_b) / n_with_tokens,
        "sampler_vs_old_logp_absdiff": jnp.sum(
            jnp.where(full_mask > 0, jnp.abs(batch["sampler_logp"] - old_flat), 0.0)) / n_tok,
        "old_logp_mean": jnp.sum(jnp.where(full_mask > 0, old_flat, 0.0)) / n_tok,
        "n_tokens": jnp.sum(mask),
    }
    data = {"cur_tokens": ch["cur_tokens"], "cur_attn": ch["cur_attn"], "old_logp": old_logp,
            "advantages": ch["advantages"], "mask": _to_chunks(mask, n_chunks)}
    if lcfg.kl_coef:
      if ref_params is None:
        raise ValueError("LossConfig.kl_coef > 0: pass ref_params to the update")
      data["ref_logp"] = no_grad_logp(ref_params, ch["cur_tokens"], ch["cur_attn"], resp_len)
    # [n_chunks, mb, ...] -> [n_minibatches, n_micro, mb, ...]
    data = jax.tree.map(lambda x: x.reshape((n_mb, n_chunks // n_mb) + x.shape[1:]), data)

    def epoch(state, _):
      return jax.lax.scan(minibatch_step, state, data)

    state, met = jax.lax.scan(epoch, state, None, length=cfg.ppo_epochs)
    met = {k: (jnp.max(v) if k == "ratio_max" else jnp.mean(v)) for k, v in met.items()}
    met.update(pre)
    return state, met

  jit_kw: dict[str, Any] = {"donate_argnums": (0,) if donate else ()}
  if state_sharding is not None:  # inputs keep the shardings they were placed with
    jit_kw["out_shardings"] = (state_sharding, None)
  return jax.jit(update, **jit_kw)


def sample_logprobs_fn(model_config, cfg: UpdateConfig, micro_rows: Optional[int] = None):
  """Jitted (params, tokens [B, L], attn [B, L], R) -> log-probs [B, R] of the last R columns,
  micro-batched. For evaluation, tests and the trainer's diagnostics."""
  rows = micro_rows or cfg.micro_rows

  def f(params, tokens, attn, resp_len):
    n_chunks = tokens.shape[0] // rows
    out = jax.lax.map(
        lambda ta: response_logprobs(params, model_config, ta[0], ta[1], resp_len,
                                     temperature=cfg.temperature, chunk_size=cfg.vocab_chunk),
        (_to_chunks(tokens, n_chunks), _to_chunks(attn, n_chunks)))
    return _from_chunks(out)

  return jax.jit(f, static_argnums=(3,))
