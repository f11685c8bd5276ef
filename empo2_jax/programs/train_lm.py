"""A generic sharded LM train step (next-token loss, grad clip + AdamW) and a sharded forward.

This is the reference program for the parallel layer: it uses the same partition rules, batch
sharding and remat knob that the EMPO2 update uses, so the sharded-vs-one-device tests and the
AOT memory figures cover the real layout.

    mesh = make_mesh("data=1,fsdp=-1,tensor=1")
    step = make_lm_train_step(model_config, mesh, LMTrainConfig())
    state = train_state_from_params(params, make_optimizer(cfg), mesh)
    state, metrics = step(state, shard_batch({"tokens": t_bt, "mask": m_bt}, mesh))
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from empo2_jax.model import llama
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.parallel import sharding as shd

# The same train state and optimizer (global-norm clip + AdamW) as the EMPO2 update.
from empo2_jax.rl.update import TrainState as LMTrainState
from empo2_jax.rl.update import make_optimizer  # noqa: F401  (takes LMTrainConfig too)


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
  lr: float = 1e-5
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  grad_clip: float = 1.0
  num_microbatches: int = 1  # gradient accumulation: rows per micro-batch = B / this
  loss_chunk: int = 512  # tokens per chunk of the vocab projection + cross-entropy


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------


def chunked_next_token_ce(hidden_btd, w_out_dv, tokens_bt, mask_bt, chunk: int):
  """(sum of next-token cross-entropy, number of scored tokens), never holding [B, T, V].

  Position t predicts token t+1; it is scored when both are real tokens (mask 1). The vocab
  projection runs over `chunk` positions at a time under remat.
  """
  b, t, d = hidden_btd.shape
  targets = jnp.concatenate([tokens_bt[:, 1:], jnp.zeros((b, 1), tokens_bt.dtype)], axis=1)
  weights = mask_bt * jnp.concatenate([mask_bt[:, 1:], jnp.zeros((b, 1), mask_bt.dtype)], axis=1)
  chunk = min(chunk, t)
  n = -(-t // chunk)
  pad = n * chunk - t

  def padded(x):
    return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))

  def to_chunks(x):
    return jnp.swapaxes(padded(x).reshape((b, n, chunk) + x.shape[2:]), 0, 1)

  xs = (to_chunks(hidden_btd), to_chunks(targets), to_chunks(weights.astype(jnp.float32)))

  @jax.checkpoint
  def body(total, x):
    h_bcd, tgt_bc, w_bc = x
    logits = jnp.einsum("bcd,dv->bcv", h_bcd, w_out_dv).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, tgt_bc[..., None], axis=-1)[..., 0]
    ce = jax.nn.logsumexp(logits, axis=-1) - picked
    return total + jnp.sum(ce * w_bc), None

  total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), xs)
  return total, jnp.sum(weights).astype(jnp.float32)


def lm_loss_sum(params, config: LlamaConfig, tokens_bt, mask_bt, chunk: int):
  hidden = llama.forward(params, config, tokens_bt, mask_bt, return_hidden=True)
  w_out = llama.output_embedding(params, config).astype(config.jnp_compute_dtype)
  return chunked_next_token_ce(hidden, w_out, tokens_bt, mask_bt, chunk)


def _to_microbatches(x, m: int, mesh: Mesh):
  """[B, ...] -> [m, B/m, ...], row b in micro-batch b % m, so each stays spread over devices."""
  rows = x.shape[0] // m
  x = jnp.swapaxes(x.reshape((rows, m) + x.shape[1:]), 0, 1)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, shd.BATCH_AXES)))


# ---------------------------------------------------------------------------------------------
# State and step
# ---------------------------------------------------------------------------------------------


def abstract_train_state(config: LlamaConfig, optimizer) -> LMTrainState:
  """ShapeDtypeStructs of the whole train state (no allocation)."""
  params = jax.eval_shape(lambda: llama.init_params(config, jax.random.key(0)))
  return jax.eval_shape(
    lambda p: LMTrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32)), params
  )


def train_state_shardings(
  config: LlamaConfig, optimizer, mesh: Mesh, rules: shd.Rules = shd.LLAMA_RULES
) -> LMTrainState:
  return shd.tree_shardings(abstract_train_state(config, optimizer), mesh, rules)


def train_state_from_params(
  params, optimizer, mesh: Mesh, rules: shd.Rules = shd.LLAMA_RULES
) -> LMTrainState:
  """Shard host params by the rules and build the optimizer state already sharded."""
  params = shd.shard_tree(params, mesh, rules)
  state_sh = shd.tree_shardings(
    jax.eval_shape(lambda p: LMTrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32)), params),
    mesh,
    rules,
  )
  init = jax.jit(
    lambda p: LMTrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32)), out_shardings=state_sh
  )
  return init(params)


def make_lm_train_step(
  config: LlamaConfig,
  mesh: Mesh,
  cfg: LMTrainConfig,
  rules: shd.Rules = shd.LLAMA_RULES,
  donate: bool = True,
):
  """jit(step)(state, {"tokens", "mask"} [B, T]) -> (state, metrics), state donated."""
  optimizer = make_optimizer(cfg)
  state_sh = train_state_shardings(config, optimizer, mesh, rules)
  m = cfg.num_microbatches

  def step(state: LMTrainState, batch):
    tokens, mask = batch["tokens"], batch["mask"].astype(jnp.int32)
    spread = mesh.shape["data"] * mesh.shape["fsdp"]
    if tokens.shape[0] % (m * spread):
      raise ValueError(
        f"batch of {tokens.shape[0]} rows must be a multiple of num_microbatches="
        f"{m} x data*fsdp={spread} so every micro-batch spans all devices"
      )
    n_scored = jnp.maximum(jnp.sum(mask[:, :-1] * mask[:, 1:]).astype(jnp.float32), 1.0)

    def micro(grads, xs):
      tok, msk = xs

      def loss_fn(p):
        return lm_loss_sum(p, config, tok, msk, cfg.loss_chunk)[0] / n_scored

      loss, g = jax.value_and_grad(loss_fn)(state.params)
      g = jax.lax.with_sharding_constraint(g, state_sh.params)
      return jax.tree.map(jnp.add, grads, g), loss

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    if m == 1:
      grads, losses = micro(zeros, (tokens, mask))
    else:
      grads, losses = jax.lax.scan(
        micro, zeros, (_to_microbatches(tokens, m, mesh), _to_microbatches(mask, m, mesh))
      )
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": jnp.sum(losses), "grad_norm": optax.global_norm(grads), "tokens": n_scored}
    return LMTrainState(params, opt_state, state.step + 1), metrics

  return jax.jit(
    shd.on_mesh(step, mesh),
    in_shardings=(state_sh, shd.batch_sharding(mesh)),
    out_shardings=(state_sh, shd.replicated(mesh)),
    donate_argnums=(0,) if donate else (),
  )


def make_sharded_forward(config: LlamaConfig, mesh: Mesh, rules: shd.Rules = shd.LLAMA_RULES):
  """jit(forward)(params, tokens [B,T], mask [B,T]) -> logits [B,T,V] fp32, batch-sharded."""
  params_abs = jax.eval_shape(lambda: llama.init_params(config, jax.random.key(0)))
  param_sh = shd.tree_shardings(params_abs, mesh, rules)
  batch_sh = shd.batch_sharding(mesh)
  return jax.jit(
    shd.on_mesh(lambda p, t, m: llama.forward(p, config, t, m), mesh),
    in_shardings=(param_sh, batch_sh, batch_sh),
    out_shardings=NamedSharding(mesh, P(shd.BATCH_AXES, None, "tensor")),
  )
