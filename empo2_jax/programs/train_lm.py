"""The LM train step: masked next-token NLL, gradients summed over micro-batches, one global-norm
clip + AdamW step; on one device, or sharded over a mesh. Also a sharded forward.

Callers: train/sft.py (behaviour cloning: the answer tokens of packed chat rows, a loss mask given,
one device) and the AOT program "lm_train_step" (programs/aot.py) with the parallel tests (every
real token after a real one scored, on a mesh). On a mesh the step uses the partition rules, batch
sharding and remat knob of the EMPO2 update and its vocabulary-chunked log-probs (rl/logprobs.py),
so the sharded-vs-one-device tests and the AOT memory figures cover the real layout.

    cfg = LMTrainConfig(micro_rows=8)
    step = make_lm_train_step(model_config, cfg)                                    # one device
    state, metrics = step(init_train_state(params, make_optimizer(cfg)), batch)     # rl/update
    mesh = make_mesh("data=1,fsdp=-1,tensor=1")
    step = make_lm_train_step(model_config, cfg, mesh=mesh)                         # sharded
    state = train_state_from_params(params, make_optimizer(cfg), mesh)
    state, metrics = step(state, shard_batch(batch, mesh))

batch: tokens, attn (1 on real tokens) and optionally loss_mask, int [B, T]; token t (t >= 1) is
scored where loss_mask[t] = 1, without loss_mask where attn[t - 1] = attn[t] = 1. The loss is the
token mean over the whole batch: the sum over micro-batches of their NLL sums / the batch's count
of scored tokens. metrics: loss, grad_norm (of the summed gradient, before clipping), tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from empo2_jax.model import llama, lora
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.parallel import sharding as shd
from empo2_jax.rl.logprobs import token_logprobs

# The same train state and optimizer (global-norm clip + AdamW) as the EMPO2 update.
from empo2_jax.rl.update import TrainState as LMTrainState
from empo2_jax.rl.update import init_train_state
from empo2_jax.rl.update import make_optimizer  # noqa: F401  (takes LMTrainConfig too)


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
  lr: float = 1e-5
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  grad_clip: float = 1.0
  micro_rows: int = 0  # rows per forward/backward (gradient-accumulation unit); 0: the whole batch
  vocab_chunk: int = 8192  # vocabulary columns per chunk of the projection (rl/logprobs.py)
  token_chunk: int = 0  # positions per chunk of the projection (next_token_nll); 0: all at once


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------


def next_token_nll(
  params,
  config: LlamaConfig,
  tokens_bt,
  attn_bt,
  score_bt,
  vocab_chunk=8192,
  token_chunk=0,
  score_index=None,
):
  """(sum of -log p over the scored tokens, number of scored tokens), float32 scalars.

  Position t-1 predicts token t; token t is scored where score_bt[:, t] = 1 (column 0 never is).
  The vocabulary projection runs `vocab_chunk` columns at a time (rl/logprobs.token_logprobs),
  so the [B, T, V] logits never exist; its largest temporary is [B x positions, vocab_chunk].
  token_chunk > 0 (and < T - 1) bounds the positions too: a scan over chunks of that many
  positions, summed chunk by chunk (another float order than token_chunk=0). On a mesh the
  positions stay spread over (data, fsdp) and the output embedding is gathered
  (token_logprobs' split_width=False: every position is projected, not a few).
  score_index [B, K] int32 (train/sft.pad_rows with answer_index): the positions of the scored
  tokens, 0 for none; only those are projected onto the vocabulary (the same sum, another float
  order; a short-answer SFT then skips most of the projection's work), and score_bt is not read.
  """
  hidden = llama.forward(params, config, tokens_bt, attn_bt, return_hidden=True)
  w_dv = llama.output_embedding(params, config)

  def nll(h, targets, weight):
    logp = token_logprobs(h, w_dv, targets, chunk_size=vocab_chunk, split_width=False)
    return -jnp.sum(jnp.where(weight > 0, logp, 0.0))

  if score_index is not None:
    b_idx = jnp.arange(tokens_bt.shape[0])[:, None]
    h = hidden[b_idx, jnp.maximum(score_index - 1, 0)]  # position t-1 predicts token t
    weight = (score_index > 0).astype(jnp.float32)
    return nll(h, tokens_bt[b_idx, score_index], weight), jnp.sum(weight)

  h, targets, weight = hidden[:, :-1], tokens_bt[:, 1:], score_bt[:, 1:].astype(jnp.float32)
  count = jnp.sum(weight)
  b, t = targets.shape
  if not token_chunk or token_chunk >= t:
    return nll(h, targets, weight), count
  n = -(-t // token_chunk)

  def to_chunks(x):  # [B, t, ...] -> [n, B, token_chunk, ...], the tail padded (weight 0)
    x = jnp.pad(x, ((0, 0), (0, n * token_chunk - t)) + ((0, 0),) * (x.ndim - 2))
    return jnp.swapaxes(x.reshape((b, n, token_chunk) + x.shape[2:]), 0, 1)

  xs = (to_chunks(h), to_chunks(targets), to_chunks(weight))
  total, _ = jax.lax.scan(lambda c, x: (c + nll(*x), None), jnp.zeros((), jnp.float32), xs)
  return total, count


def next_token_scores(attn_bt):
  """The loss mask of plain LM training: 1 on every real token whose predecessor is real."""
  return attn_bt * jnp.pad(attn_bt[:, :-1], ((0, 0), (1, 0)))


def _scored(batch):
  """(tokens, attn, loss mask, score_index or None) of a batch, the mask next_token_scores(attn)
  when not given."""
  tokens, attn = batch["tokens"], batch["attn"]
  score = batch["loss_mask"] if "loss_mask" in batch else next_token_scores(attn)
  return tokens, attn, score, batch.get("score_index")


def _spread(mesh: Mesh | None) -> int:
  """The devices a batch's rows are split over: data * fsdp (shard_batch), 1 without a mesh."""
  return 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]


def _micro_batches(x, rows: int, spread: int):
  """[B, ...] -> [B / rows, rows, ...]. The batch's rows lie in `spread` equal blocks, one per
  (data, fsdp) device; micro-batch i takes the i-th rows / spread rows of every block, so each
  device keeps its own rows (no batch data moves). spread 1 (one device): micro-batch i is rows
  i*rows .. (i+1)*rows - 1."""
  m = x.shape[0] // rows
  x = jnp.swapaxes(x.reshape((spread, m, rows // spread) + x.shape[1:]), 0, 1)
  return x.reshape((m, rows) + x.shape[3:])


# ---------------------------------------------------------------------------------------------
# State and step
# ---------------------------------------------------------------------------------------------


def abstract_train_state(config: LlamaConfig, optimizer) -> LMTrainState:
  """ShapeDtypeStructs of the whole train state (no allocation)."""
  key = jax.random.key(0)
  params = jax.eval_shape(lambda: lora.with_adapters(llama.init_params(config, key), config, key))
  return jax.eval_shape(lambda p: init_train_state(p, optimizer), params)


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
    jax.eval_shape(lambda p: init_train_state(p, optimizer), params), mesh, rules
  )
  return jax.jit(lambda p: init_train_state(p, optimizer), out_shardings=state_sh)(params)


def make_lm_train_step(
  config: LlamaConfig,
  cfg: LMTrainConfig,
  *,
  mesh: Mesh | None = None,
  optimizer: optax.GradientTransformation | None = None,
  rules: shd.Rules = shd.LLAMA_RULES,
  donate: bool = True,
):
  """jit(step)(state, batch) -> (state, metrics): one optimizer step on the token-mean
  next-token NLL of the batch (module docstring), gradients summed in float32 over micro-batches
  of cfg.micro_rows rows (_micro_batches; B must be a multiple, and on a mesh micro_rows a
  multiple of data*fsdp) and handed to the optimizer in the params' dtype.

  optimizer: default make_optimizer(cfg). mesh: None for one device (plain jit); else the state
  and its gradients are sharded by `rules`, the batch's rows over (data, fsdp) (shard_batch), the
  metrics replicated. The state is donated unless donate=False."""
  if optimizer is None:
    optimizer = make_optimizer(cfg)
  state_sh = None if mesh is None else train_state_shardings(config, optimizer, mesh, rules)

  def step(state: LMTrainState, batch):
    tokens, attn, score, index = _scored(batch)
    b = tokens.shape[0]
    rows = cfg.micro_rows or b
    if b % rows:
      raise ValueError(f"batch of {b} rows is not a multiple of micro_rows={rows}")
    if rows % (spread := _spread(mesh)):
      raise ValueError(
        f"micro-batches of {rows} rows must be a multiple of data*fsdp={spread} so every "
        "micro-batch spans all devices"
      )
    chunks = {"tokens": tokens, "attn": attn, "score": score}
    if index is not None:
      chunks["index"] = index
    chunks = jax.tree.map(lambda x: _micro_batches(x, rows, spread), chunks)
    if mesh is not None:  # every micro-batch over all (data, fsdp) devices
      chunks = jax.lax.with_sharding_constraint(
        chunks, NamedSharding(mesh, P(None, shd.BATCH_AXES))
      )
    n_tok = jnp.maximum(jnp.sum(score[:, 1:]).astype(jnp.float32), 1.0)

    train, frozen = lora.trainable(state.params)  # LoRA: the adapters; else every weight

    def micro(grads, d):
      def loss_fn(t):
        nll, _ = next_token_nll(
          lora.join(t, frozen), config, d["tokens"], d["attn"], d["score"], cfg.vocab_chunk,
          cfg.token_chunk, d.get("index"),
        )  # fmt: skip
        return nll / n_tok

      loss, g = jax.value_and_grad(loss_fn)(train)
      if state_sh is not None:
        g = jax.lax.with_sharding_constraint(g, lora.trainable(state_sh.params)[0])
      return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), grads, g), loss

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train)
    grads, losses = jax.lax.scan(micro, zeros, chunks)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, train)  # fp32: a no-op
    updates, opt_state = optimizer.update(grads, state.opt_state, train)
    params = lora.join(optax.apply_updates(train, updates), frozen)
    metrics = {"loss": jnp.sum(losses), "grad_norm": optax.global_norm(grads), "tokens": n_tok}
    return LMTrainState(params, opt_state, state.step + 1), metrics

  donate_argnums = (0,) if donate else ()
  if mesh is None:
    return jax.jit(step, donate_argnums=donate_argnums)
  return jax.jit(
    shd.on_mesh(step, mesh),
    in_shardings=(state_sh, shd.batch_sharding(mesh)),
    out_shardings=(state_sh, shd.replicated(mesh)),
    donate_argnums=donate_argnums,
  )


def make_lm_eval_loss(config: LlamaConfig, cfg: LMTrainConfig):
  """jit(f)(params, batch) -> the step's loss without the update: the token-mean next-token NLL
  of the whole batch, summed micro-batch by micro-batch (one device)."""

  def f(params, batch):
    tokens, attn, score, index = _scored(batch)
    rows = cfg.micro_rows or tokens.shape[0]
    chunks = [_micro_batches(x, rows, 1) for x in (tokens, attn, score)]
    chunks.append(None if index is None else _micro_batches(index, rows, 1))

    def one(d):
      tok, att, sc, idx = d
      return jnp.stack(
        next_token_nll(params, config, tok, att, sc, cfg.vocab_chunk, cfg.token_chunk, idx)
      )

    sums = jax.lax.map(one, chunks)
    return jnp.sum(sums[:, 0]) / jnp.maximum(jnp.sum(sums[:, 1]), 1.0)

  return jax.jit(f)


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
