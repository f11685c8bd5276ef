"""The sampler's KV cache: its layout, its storage, its writes, and attention over it.

The cache is a dict with k, v [L, B, K, S, hd] and mask [B, S] (1 where a slot holds a real
token). `llama.forward(..., cache=cache, cache_index=idx)` writes the new tokens' keys/values into
slots idx[b] .. idx[b]+T-1 of row b and attends over all valid slots at or before each query's slot.
The caller guarantees idx[b] + T <= S; padded new tokens (attention_mask 0) are written but marked
invalid, so the next write can start at idx[b] + (number of real tokens). Heads come before slots
so that a layer's attention reads each row's keys of one head as one contiguous [S, hd] matrix
(no transpose per decode step); keys are read in `config.cache_block`-slot blocks, and only the
blocks below max(idx) + T, so a step costs the filled part of the cache (`attend_cached`; a decode
step on the CPU backend reads each row's filled slots in place in model/cpu_attention.cc instead,
`attend_cached_kernel`, where LlamaConfig.decode_kernels allows). On the
CPU backend a bfloat16 cache stores its values' bits as uint16 (CACHE_BITS says why);
`cache_values` reads them back.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from empo2_jax.model import cpu_kernels
from empo2_jax.model.configs import LlamaConfig

Params = dict[str, Any]
NEG_INF = -1e30  # the score of a masked slot (finite: exp(NEG_INF - m) is an exact 0)


def cache_shape(config: LlamaConfig, batch: int, length: int) -> tuple[int, ...]:
  """Shape of the cache's k and v: [L, B, K, S, hd]."""
  return (config.num_layers, batch, config.num_kv_heads, length, config.head_dim)


# A bfloat16 cache held as its bit patterns. XLA:CPU computes bf16 in float32: a bf16 scatter into
# the cache converts the whole [L, B, K, S, hd] buffer to float32 and back at every write (measured
# on SmolLM2-135M, 8 rows, 2.7k slots: a decode step 2.2 s against 0.09 s with a float32 cache).
# A uint16 scatter is done in place; reads bitcast each block back to bfloat16 (`cache_values`).
CACHE_BITS = {jnp.dtype(jnp.bfloat16): jnp.dtype(jnp.uint16)}


def cache_storage_dtype(dtype, backend: Optional[str] = None) -> jnp.dtype:
  """The dtype the cache's k and v are stored in for values of `dtype`: bfloat16 as uint16 bits on
  the CPU backend (CACHE_BITS), otherwise `dtype` itself. `backend`: default jax's default."""
  dtype = jnp.dtype(dtype)
  if (backend or jax.default_backend()) == "cpu" and dtype in CACHE_BITS:
    return CACHE_BITS[dtype]
  return dtype


def init_cache(
  config: LlamaConfig, batch: int, length: int, dtype=jnp.bfloat16, backend: Optional[str] = None
) -> Params:
  """An empty KV cache: k, v [L, B, K, S, hd] zeros holding `dtype` values (stored as
  cache_storage_dtype(dtype, backend)), mask [B, S] int32 zeros."""
  shape = cache_shape(config, batch, length)
  store = cache_storage_dtype(dtype, backend)
  return {
    "k": jnp.zeros(shape, store),
    "v": jnp.zeros(shape, store),
    "mask": jnp.zeros((batch, length), jnp.int32),
  }


def cache_values(buf: jax.Array) -> jax.Array:
  """The cache's values from its storage: bits bitcast back to their float dtype, else as is."""
  for value, bits in CACHE_BITS.items():
    if buf.dtype == bits:
      return jax.lax.bitcast_convert_type(buf, value)
  return buf


def _cache_store(new: jax.Array, store: jnp.dtype) -> jax.Array:
  """New keys/values in the cache's storage dtype (CACHE_BITS: rounded, then their bits)."""
  for value, bits in CACHE_BITS.items():
    if store == bits:
      return jax.lax.bitcast_convert_type(new.astype(value), bits)
  return new.astype(store)


def write_rows(buf: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """buf [B, S, ...] <- new [B, T, ...] at per-row offsets index [B]."""

  def one(b, n, i):
    start = (i,) + (0,) * (b.ndim - 1)
    return jax.lax.dynamic_update_slice(b, n.astype(b.dtype), start)

  return jax.vmap(one)(buf, new, index)


def write_cache(buf: jax.Array, layer, new: jax.Array, index: jax.Array, rows=None) -> jax.Array:
  """buf [L, B', K, S, hd] <- new [B, T, K, hd] at layer `layer`, cache row rows[b] (default b),
  slots index[b] + t, in place (a scatter into the whole buffer: no slice is copied out)."""
  b, t = new.shape[:2]
  rows = (jnp.arange(b) if rows is None else rows)[:, None]
  slots = index[:, None] + jnp.arange(t)[None, :]
  return buf.at[layer, rows, :, slots].set(_cache_store(new, buf.dtype))


def attend_cached(q, k_all, v_all, layer, rows, q_slot, mask, dtype, block: int):
  """Attention of q [B, T, H, hd] over layer `layer` of the cache k/v_all [L, B', K, S, hd], row
  b of the batch reading cache row rows[b] (None: row b).

  Query (b, t) sees slot s when s <= q_slot[b, t] and mask[b, s] > 0, as `_attend` with that
  `allowed`. Keys are read `block` slots at a time with an online softmax (running max, sum and
  weighted values in float32), and the loop stops after the block holding max(q_slot): slots past
  every query are never read. A query that sees no slot gets zeros. Returns [B, T, H*hd].
  """
  b, t, h, hd = q.shape
  _, b_all, kv_heads, s, _ = k_all.shape
  g = h // kv_heads
  sb = min(block, s)
  q = q.reshape(b, t, kv_heads, g, hd).astype(dtype)
  n_blocks = (jnp.max(q_slot) + sb) // sb  # blocks [0, n_blocks) cover slots 0..max(q_slot)

  def body(carry):
    j, m, norm, acc = carry
    start = jnp.minimum(j * sb, s - sb)  # the last block may overlap its predecessor ...
    kb = jax.lax.dynamic_slice(k_all, (layer, 0, 0, start, 0), (1, b_all, kv_heads, sb, hd))[0]
    vb = jax.lax.dynamic_slice(v_all, (layer, 0, 0, start, 0), (1, b_all, kv_heads, sb, hd))[0]
    if rows is not None:  # a block of every row is small; then keep the batch's rows
      kb, vb = kb[rows], vb[rows]
    kb, vb = cache_values(kb), cache_values(vb)
    mb = jax.lax.dynamic_slice(mask, (0, start), (b, sb))
    slot = start + jnp.arange(sb)
    ok = (
      (slot[None, None, :] <= q_slot[:, :, None])
      & (mb[:, None, :] > 0)
      & (slot >= j * sb)[None, None, :]  # ... whose slots it does not count twice
    )[:, None, None]  # [B, 1, 1, T, sb]
    sc = jnp.einsum("btkgd,bksd->bkgts", q, kb.astype(dtype)).astype(jnp.float32) * (hd**-0.5)
    sc = jnp.where(ok, sc, NEG_INF)
    m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
    # Once a query has seen a slot (m_new finite) its disallowed slots get exp(NEG_INF - m_new) =
    # 0 exactly; before, they add garbage that the first seen slot's scale exp(NEG_INF - m_new)
    # = 0 wipes out, and a query that never sees one is zeroed below (no second select here).
    p = jnp.exp(sc - m_new[..., None])
    scale = jnp.exp(m - m_new)
    pv = jnp.einsum("bkgts,bksd->bkgtd", p.astype(dtype), vb.astype(dtype))
    return j + 1, m_new, norm * scale + p.sum(-1), acc * scale[..., None] + pv.astype(jnp.float32)

  init = (
    jnp.int32(0),
    jnp.full((b, kv_heads, g, t), NEG_INF, jnp.float32),
    jnp.zeros((b, kv_heads, g, t), jnp.float32),
    jnp.zeros((b, kv_heads, g, t, hd), jnp.float32),
  )
  _, m, norm, acc = jax.lax.while_loop(lambda c: c[0] < n_blocks, body, init)
  # zeros where no slot was seen; a NaN score (a diverged model) makes m NaN and stays NaN
  out = jnp.where((m <= NEG_INF / 2)[..., None], 0.0, acc / norm[..., None])
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd).astype(dtype)


def attend_cached_kernel(q, k_all, v_all, layer, rows, q_slot, mask, config: LlamaConfig):
  """attend_cached for a float32 cache by model/cpu_kernels.py on the CPU platform (one query a
  row: cached_attention; several: prefill_attention, for head sizes it has a kernel for),
  attend_cached elsewhere."""
  b, t, h, hd = q.shape
  kv_heads = k_all.shape[2]
  dt = config.jnp_compute_dtype
  row_ids = jnp.arange(b, dtype=jnp.int32) if rows is None else rows

  def cpu(q, k_all, v_all, q_slot, mask):
    if t == 1:
      out = cpu_kernels.cached_attention(
        q.reshape(b, kv_heads, h // kv_heads, hd), k_all, v_all, layer, row_ids, q_slot[:, 0], mask
      )
    else:
      out = cpu_kernels.prefill_attention(
        q.reshape(b, t, kv_heads, h // kv_heads, hd), k_all, v_all, layer, row_ids, q_slot, mask
      )
    return out.reshape(b, t, h * hd).astype(dt)

  def default(q, k_all, v_all, q_slot, mask):
    return attend_cached(q, k_all, v_all, layer, rows, q_slot, mask, dt, config.cache_block)

  return jax.lax.platform_dependent(q, k_all, v_all, q_slot, mask, cpu=cpu, default=default)
