"""Blockwise (FlashAttention-2 style) attention for the cache-free forward, with its own backward.

`flash_attention(q, k, v, key_mask, block=..., causal=True)` computes what `llama._attend` computes
with allowed[b, t, s] = (s <= t when causal) & (key_mask[b, s] > 0), without ever holding the
[T, S] score matrix:

  forward   queries and keys are cut into tiles of `block` positions; for each query tile the key
            tiles are visited in order with an online softmax (running row max m, row sum l and
            the weighted values, all float32); key tiles entirely above the causal diagonal are
            not computed at all (about half the tiles). Saved for the backward: q, k, v, the
            output and the per-query logsumexp lse = m + log(l) (float32, [B, K, T*G]).
  backward  (`jax.custom_vjp`) recomputes each tile's scores from q, k and lse, p = exp(s - lse),
            and accumulates dv += p^T do, ds = p * (do v^T - rowsum(do * out)), dq += ds k,
            dk += ds^T q (FlashAttention-2). Nothing [T, S]-sized is saved or built: one
            [B, K, block*G, block] float32 tile per step.

Numerics contract: matmuls take the given `dtype` (the model's compute dtype) and accumulate in
float32 (preferred_element_type); scores, the softmax statistics, the output accumulator and all
gradient accumulators are float32; the output and gradients are cast back to the input dtypes.
The result equals the full score matrix softmax (`llama._attend`) up to float rounding. A query
with no allowed key (left padding under a causal mask, or a row without real keys) gets output
zeros and zero gradients (`_attend` averages every key there instead; padding outputs are never
read by the model's losses).

Layout inside: heads grouped as GQA wants, q -> [B, K, T*G, hd] (rows ordered (t, g), so a query
tile is a contiguous row range), k/v -> [B, K, S, hd]. The tiles are unrolled as static Python
loops: on XLA:CPU that compiles once per layer body (the decoder layers are scanned) and lets XLA
fuse each tile's mask, exp and reductions (bench/attention.py measures it).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

F32 = jnp.float32


def _tiles(t: int, s: int, block: int, causal: bool):
  """Static tiling. For each query tile (a, b): `run`, the number of leading key tiles of length
  `bk` that every query of the tile sees whole (no causal mask: visited by a lax loop), and the
  remaining key tiles (c, d, needs_causal_mask) it must visit (unrolled). Causal: key tiles that
  start after the tile's last query are skipped. Returns (bk, [((a, b), run, [(c, d, diag)])])."""
  bq = t if block <= 0 else min(block, t)
  bk = s if block <= 0 else min(block, s)
  out = []
  for a in range(0, t, bq):
    b = min(a + bq, t)
    run, rest = 0, []
    for c in range(0, s, bk):
      d = min(c + bk, s)
      if causal and c > b - 1:
        break
      diagonal = causal and d - 1 > a  # some key after some query: needs the causal mask
      if not diagonal and d - c == bk and not rest:
        run += 1
      else:
        rest.append((c, d, diagonal))
    out.append(((a, b), run, rest))
  return bk, out


def _tile_allowed(mask_t, a, b, c, g, diagonal):
  """[B, 1, (b-a)*G, C] bool from the key tile's mask [B, C]: key real and (on a diagonal tile)
  key position <= query position. c may be traced (off-diagonal tiles only)."""
  ok = (mask_t > 0)[:, None, None, :]
  if diagonal:
    q_pos = a + jnp.arange((b - a) * g) // g  # rows ordered (t, g)
    k_pos = c + jnp.arange(mask_t.shape[1])
    ok = ok & (k_pos[None, :] <= q_pos[:, None])[None, None]
  return ok


def _keys(k, v, mask, c, size):
  """Key tile [c, c + size) of k/v [B, K, S, hd] and mask [B, S] (c static or traced)."""
  if isinstance(c, int):
    return k[:, :, c : c + size], v[:, :, c : c + size], mask[:, c : c + size]
  sl = jax.lax.dynamic_slice_in_dim
  return sl(k, c, size, 2), sl(v, c, size, 2), sl(mask, c, size, 1)


def _scores(q_tile, k_tile, scale):
  """[B, K, R, hd] x [B, K, C, hd] -> float32 [B, K, R, C] scaled scores."""
  s = jnp.einsum("bkrd,bkcd->bkrc", q_tile, k_tile, preferred_element_type=F32)
  return s * scale


def _forward(q, k, v, mask, block, causal, g):
  """q [B,K,T*G,hd], k/v [B,K,S,hd] (one dtype), mask [B,S] -> out [B,K,T*G,hd] (q's dtype),
  lse [B,K,T*G] float32 (+inf for a row with no allowed key)."""
  t, s, hd = q.shape[2] // g, k.shape[2], q.shape[3]
  scale = hd**-0.5
  bk, tiles = _tiles(t, s, block, causal)
  outs, lses = [], []
  for (a, b), run, rest in tiles:
    q_t = q[:, :, a * g : b * g]

    def visit(state, c, size, diagonal, q_t=q_t, a=a, b=b):
      m, tot, acc = state
      k_t, v_t, mask_t = _keys(k, v, mask, c, size)
      sc = _scores(q_t, k_t, scale)
      sc = jnp.where(_tile_allowed(mask_t, a, b, c, g, diagonal), sc, -jnp.inf)
      m_new = jnp.maximum(m, sc.max(-1))
      m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # no allowed key yet: exp(-inf) = 0
      p = jnp.exp(sc - m_use[..., None])
      corr = jnp.exp(m - m_use)
      pv = jnp.einsum("bkrc,bkcd->bkrd", p.astype(v.dtype), v_t, preferred_element_type=F32)
      return m_new, tot * corr + p.sum(-1), acc * corr[..., None] + pv

    rows = q_t.shape[:3]
    state = (jnp.full(rows, -jnp.inf, F32), jnp.zeros(rows, F32), jnp.zeros(rows + (hd,), F32))
    if run:
      state = jax.lax.fori_loop(0, run, lambda j, st: visit(st, j * bk, bk, False), state)
    for c, d, diagonal in rest:
      state = visit(state, c, d - c, diagonal)
    m, tot, acc = state
    seen = tot > 0
    outs.append((acc / jnp.where(seen, tot, 1.0)[..., None]).astype(q.dtype))
    lses.append(jnp.where(seen, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(tot), jnp.inf))
  return jnp.concatenate(outs, axis=2), jnp.concatenate(lses, axis=2)


def _backward(q, k, v, mask, out, lse, dout, block, causal, g):
  """FlashAttention-2 backward over the same tiles: (dq, dk, dv) in float32."""
  t, s, hd = q.shape[2] // g, k.shape[2], q.shape[3]
  scale = hd**-0.5
  dt = q.dtype
  dout = dout.astype(dt)
  delta = jnp.sum(dout.astype(F32) * out.astype(F32), axis=-1)  # [B, K, T*G]
  bk, tiles = _tiles(t, s, block, causal)
  dk = jnp.zeros(k.shape, F32)
  dv = jnp.zeros(v.shape, F32)
  dq_tiles = []
  for (a, b), run, rest in tiles:
    q_t, do_t = q[:, :, a * g : b * g], dout[:, :, a * g : b * g]
    lse_t, delta_t = lse[:, :, a * g : b * g, None], delta[:, :, a * g : b * g, None]

    def visit(state, c, size, diagonal, q_t=q_t, do_t=do_t, lse_t=lse_t, delta_t=delta_t, a=a, b=b):
      dq_t, dk, dv = state
      k_t, v_t, mask_t = _keys(k, v, mask, c, size)
      sc = _scores(q_t, k_t, scale)
      sc = jnp.where(_tile_allowed(mask_t, a, b, c, g, diagonal), sc, -jnp.inf)
      p = jnp.exp(sc - lse_t)  # 0 where disallowed and on rows without keys (lse = +inf)
      dv_t = jnp.einsum("bkrc,bkrd->bkcd", p.astype(dt), do_t, preferred_element_type=F32)
      dp = jnp.einsum("bkrd,bkcd->bkrc", do_t, v_t, preferred_element_type=F32)
      ds = (p * (dp - delta_t) * scale).astype(dt)
      dq_t = dq_t + jnp.einsum("bkrc,bkcd->bkrd", ds, k_t, preferred_element_type=F32)
      dk_t = jnp.einsum("bkrc,bkrd->bkcd", ds, q_t, preferred_element_type=F32)
      return dq_t, _add_at(dk, dk_t, c), _add_at(dv, dv_t, c)

    state = (jnp.zeros(q_t.shape, F32), dk, dv)
    if run:
      state = jax.lax.fori_loop(0, run, lambda j, st: visit(st, j * bk, bk, False), state)
    for c, d, diagonal in rest:
      state = visit(state, c, d - c, diagonal)
    dq_t, dk, dv = state
    dq_tiles.append(dq_t)
  return jnp.concatenate(dq_tiles, axis=2), dk, dv


def _add_at(acc, tile, c):
  """acc [B, K, S, hd] plus tile [B, K, C, hd] at positions c .. c+C-1 (c static or traced)."""
  if isinstance(c, int):
    return acc.at[:, :, c : c + tile.shape[2]].add(tile)
  cur = jax.lax.dynamic_slice_in_dim(acc, c, tile.shape[2], 2)
  return jax.lax.dynamic_update_slice_in_dim(acc, cur + tile, c, 2)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, mask, block, causal, g):
  return _forward(q, k, v, mask, block, causal, g)[0]


def _flash_fwd(q, k, v, mask, block, causal, g):
  out, lse = _forward(q, k, v, mask, block, causal, g)
  return out, (q, k, v, mask, out, lse)


def _flash_bwd(block, causal, g, res, dout):
  q, k, v, mask, out, lse = res
  dq, dk, dv = _backward(q, k, v, mask, out, lse, dout, block, causal, g)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, key_mask, *, block: int, dtype, causal: bool = True):
  """q [B,T,H,hd], k/v [B,S,K,hd] (H = K*G), key_mask [B,S] (>0: a real key) -> [B,T,H*hd] in
  `dtype`. Query t sees key s when key_mask[b, s] > 0 and, if causal, s <= t (T == S: query
  and key positions coincide). `block`: tile length for queries and keys (0: one tile)."""
  b, t, h, hd = q.shape
  s, kv_heads = k.shape[1], k.shape[2]
  g = h // kv_heads
  if causal and s != t:
    raise ValueError(f"causal flash attention needs T == S, got T={t}, S={s}")
  q4 = q.astype(dtype).reshape(b, t, kv_heads, g, hd).transpose(0, 2, 1, 3, 4)
  q4 = q4.reshape(b, kv_heads, t * g, hd)
  k4 = k.astype(dtype).transpose(0, 2, 1, 3)
  v4 = v.astype(dtype).transpose(0, 2, 1, 3)
  out = _flash(q4, k4, v4, jnp.asarray(key_mask, jnp.int32), int(block), bool(causal), g)
  out = out.reshape(b, kv_heads, t, g, hd).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, t, h * hd)


__all__ = ["flash_attention"]
