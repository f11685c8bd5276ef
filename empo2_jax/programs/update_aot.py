"""Registers the EMPO2 update as the AOT program "train_step" (empo2_jax/programs/aot.py).

Importing this module adds the program; `launch/aot.py` must import it to offer it:

    python launch/aot.py --program=train_step --preset=7b --topology=v5p:2x2x1 \
        --batch=128 --seq=4532 --microbatches=32

The request's batch is the number of turn samples (rows) of one update call, seq the padded prompt +
response length (the last RESPONSE_LEN columns are the response), `update` the update's settings
(launch/aot.py: those of its config). The rows form batch / minibatch_size mini-batches of the
settings' minibatch_size (the config's: 128, docs/method.md §1 item 5), or one mini-batch when
batch is smaller; microbatches is the gradient-accumulation steps of one mini-batch (launch/aot.py's
default: optim.minibatch_size // optim.micro_rows = 16). Params (fp32 masters unless the request
says otherwise: the update refuses other storage) and AdamW state are sharded by the LLAMA_RULES,
rows over (data, fsdp). With LoRA (request lora_rank > 0) the state is the frozen base in the
request's param_dtype (bf16 allowed) plus fp32 adapters, and AdamW state for the adapters only.
Memory hardly depends on the number of mini-batches (their rows are data, processed one at a
time).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from empo2_jax.model import llama, lora
from empo2_jax.parallel import sharding as shd
from empo2_jax.programs.aot import (
  Program,
  forward_flops_per_token,
  matmul_floor,
  register_program,
)
from empo2_jax.rl.update import UpdateConfig, init_train_state, make_optimizer, make_update_fn

RESPONSE_LEN = 32  # docs/method.md §2: max response 32 tokens
VOCAB_CHUNK = 8192


def abstract_batch(mesh, rows: int, length: int, response_len: int = RESPONSE_LEN) -> dict:
  """ShapeDtypeStructs of an rl/batch.build_batch batch, rows sharded over (data, fsdp)."""
  sh = shd.batch_sharding(mesh)

  def s(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

  tok = s((rows, length), jnp.int32)
  resp = s((rows, response_len), jnp.float32)
  return {
    "cur_tokens": tok,
    "cur_attn": tok,
    "old_tokens": tok,
    "old_attn": tok,
    "response_mask": resp,
    "sampler_logp": resp,
    "advantages": s((rows,), jnp.float32),
    "sample_index": s((rows,), jnp.int32),
  }


def update_forwards(config) -> int:
  """Forward-equivalents of matmul work a trained token costs: old log-probs (1) + forward (1) +
  backward (2: input and weight gradients), or with LoRA 3 (the frozen base's weight gradients
  are never formed; the adapters' products are <1% at rank 64 and not counted)."""
  return 3 if config.lora_rank else 4


def update_flops(config, rows: int, length: int, response_len: int) -> float:
  """update_forwards' forwards; the vocabulary projection only for the response positions."""
  head = 2.0 * config.hidden_size * config.vocab_size
  body = forward_flops_per_token(config, length) - head
  return update_forwards(config) * (body * rows * length + head * rows * response_len)


@register_program("train_step", microbatched=True)
def _train_step(config, mesh, req):
  if req.seq <= RESPONSE_LEN:
    raise ValueError(f"seq={req.seq} must exceed the response length {RESPONSE_LEN}")
  if not isinstance(req.update, UpdateConfig):
    raise ValueError("train_step needs the update's settings: AotRequest.update (UpdateConfig)")
  minibatch = min(req.update.minibatch_size, req.batch)
  if req.batch % minibatch:
    raise ValueError(
      f"batch={req.batch} must be a multiple of the mini-batch size {minibatch} "
      "(optim.minibatch_size)"
    )
  if minibatch % req.num_microbatches:
    raise ValueError(
      f"the mini-batch of {minibatch} rows must be a multiple of microbatches="
      f"{req.num_microbatches}"
    )
  # The cost probe (aot._probe_cost) asks for loss_chunk == seq and one micro-batch: then project
  # the whole vocabulary in one chunk, as XLA counts a loop body once.
  chunk = config.vocab_size if req.loss_chunk == req.seq else VOCAB_CHUNK
  cfg = dataclasses.replace(
    req.update,
    minibatch_size=minibatch,
    micro_rows=minibatch // req.num_microbatches,
    vocab_chunk=chunk,
  )
  opt = make_optimizer(cfg)
  key = jax.random.key(0)
  state = jax.eval_shape(
    lambda: init_train_state(lora.with_adapters(llama.init_params(config, key), config, key), opt)
  )
  state = shd.abstract_on_mesh(state, mesh)
  state_sharding = jax.tree.map(lambda x: x.sharding, state)
  fn = make_update_fn(
    config,
    cfg,
    opt,
    batch_sharding=shd.batch_sharding(mesh),
    state_sharding=state_sharding,
    fuse_layer_grads=req.fuse_layer_grads,
  )
  batch = abstract_batch(mesh, req.batch, req.seq)
  # The old log-probs forward has no backward, hence no recompute: 3 + 1 forwards + the remat's.
  forwards = update_forwards(config)
  floor = matmul_floor(
    config, req.batch * req.seq, req.batch * RESPONSE_LEN, forwards=forwards, grads=True
  )
  return Program(fn, (state, batch), update_flops(config, req.batch, req.seq, RESPONSE_LEN), floor)
