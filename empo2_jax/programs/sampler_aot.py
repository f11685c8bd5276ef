"""AOT programs of the sampler for programs/aot.py: `sampler` (decode loop) and `sampler_prefill`.

Importing this module registers them in `empo2_jax.programs.aot.PROGRAMS`. Request fields used:
batch = session rows, seq = cache length per row (prompt + response room + chunk headroom),
compute_dtype for the matmuls (the cache is bf16, SamplerSettings' default). `sampler` is the
jitted decode loop for 32 new tokens (the EMPO2 action length) in "sample" mode; `sampler_prefill`
is one prefill chunk of the largest default chunk length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from empo2_jax.model import kv_cache, llama, lora
from empo2_jax.programs import aot
from empo2_jax.parallel import sharding as shd
from empo2_jax.sampling import kernels
from empo2_jax.sampling.sampler import SamplerSettings

ACTION_TOKENS = 32


def _abstract(config, mesh, req):
  settings = SamplerSettings()
  key = jax.random.key(0)  # with LoRA the sampler reads the adapters unmerged, as in training
  params = shd.abstract_on_mesh(
    jax.eval_shape(lambda: lora.with_adapters(llama.init_params(config, key), config, key)), mesh
  )
  rows = shd.batch_sharding(mesh)
  kv = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, shd.BATCH_AXES))
  shape = kv_cache.cache_shape(config, req.batch, req.seq)
  dt = jnp.dtype(settings.cache_dtype)
  cache = {
    "k": jax.ShapeDtypeStruct(shape, dt, sharding=kv),
    "v": jax.ShapeDtypeStruct(shape, dt, sharding=kv),
    "mask": jax.ShapeDtypeStruct((req.batch, req.seq), jnp.int32, sharding=rows),
  }

  def row(*s, dtype=jnp.int32):
    return jax.ShapeDtypeStruct((req.batch,) + s, dtype, sharding=rows)

  hidden = row(config.hidden_size, dtype=config.jnp_compute_dtype)
  return settings, params, cache, hidden, row


@aot.register_program("sampler")
def _decode_program(config, mesh, req):
  settings, params, cache, hidden, row = _abstract(config, mesh, req)
  keys = jax.ShapeDtypeStruct((req.batch, 2), jnp.uint32, sharding=shd.batch_sharding(mesh))

  def scalar(dtype):
    return jax.ShapeDtypeStruct((), dtype)

  stops = jax.ShapeDtypeStruct((settings.max_stop_ids,), jnp.int32)

  def decode(params, cache, hidden, length, active, keys, temperature, top_p, top_k, stops, n):
    return kernels.decode(
      params,
      config,
      cache,
      hidden,
      length,
      active,
      keys,
      temperature,
      top_p,
      top_k,
      stops,
      n,
      mode="sample",
      buffer=ACTION_TOKENS,
    )

  args = (
    params,
    cache,
    hidden,
    row(),
    row(dtype=jnp.bool_),
    keys,
    scalar(jnp.float32),
    scalar(jnp.float32),
    scalar(jnp.int32),
    stops,
    scalar(jnp.int32),
  )
  flops = aot.forward_flops_per_token(config, req.seq) * req.batch * ACTION_TOKENS
  return aot.Program(jax.jit(decode, donate_argnums=(1,)), args, flops)


@aot.register_program("sampler_prefill")
def _prefill_program(config, mesh, req):
  settings, params, cache, hidden, row = _abstract(config, mesh, req)
  chunk = settings.max_chunk

  def prefill(params, cache, hidden, tokens, mask, start, end):
    return kernels.prefill_chunk(params, config, cache, hidden, tokens, mask, start, end)

  args = (params, cache, hidden, row(chunk), row(chunk), row(), row())
  flops = aot.forward_flops_per_token(config, req.seq) * req.batch * chunk
  return aot.Program(jax.jit(prefill, donate_argnums=(1,)), args, flops)
