"""Token log-probs and entropies from final hidden states, in vocabulary chunks.

`token_logprobs(h [..., D], w [D, V], targets [...])` scans the vocabulary in chunks of
`chunk_size` columns with an online logsumexp in float32, so the `[N, V]` logits never exist: the
largest temporary is one `[N, chunk_size]` block. The backward pass (custom VJP) scans the chunks
again, recomputing each block from the saved per-token log-normaliser and expected logit, so it
keeps nothing per chunk either. A vocabulary that the chunk size does not divide is handled with one
smaller tail chunk (no padding copy of `w`).

With temperature tau the distribution is softmax(h @ w / tau), as the sampler draws it.
Per-token temperatures (tokens sampled at different temperatures): `inv_temperature` [...] gives
each position its own 1/tau; the distribution at a position is then
softmax(h @ w * inv_temperature), the one that position was sampled from, so the PPO ratio
compares like with like.
Entropy H = logZ - E_p[z]; dlogp/dz = onehot - p; dH/dz = -p (z - E_p[z]).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from empo2_jax.model import llama
from empo2_jax.parallel.sharding import shard_activation

F32 = jnp.float32


def _chunk_plan(vocab, chunk_size):
  """[(start, size)] static plan: n_full chunks of chunk_size, then an optional tail."""
  size = min(chunk_size, vocab)
  n_full = vocab // size
  tail = vocab - n_full * size
  return size, n_full, tail


def _scan_chunks(body, carry, w, chunk_size):
  """Runs body(carry, w_chunk [D, C], start) over all chunks of w; body returns (carry, y)."""
  size, n_full, tail = _chunk_plan(w.shape[1], chunk_size)

  def step(c, i):
    start = i * size
    return body(c, jax.lax.dynamic_slice_in_dim(w, start, size, axis=1), start)

  carry, ys = jax.lax.scan(step, carry, jnp.arange(n_full))
  y_tail = None
  if tail:
    carry, y_tail = body(carry, w[:, n_full * size :], n_full * size)
  return carry, ys, y_tail


def _logits(h, w_c, inv_temp):
  """[N, C] logits of one chunk; inv_temp a Python float or an [N] array (per token)."""
  if not isinstance(inv_temp, float):
    inv_temp = inv_temp[:, None]
  return jnp.dot(h, w_c.astype(h.dtype), preferred_element_type=F32) * inv_temp  # [N, C]


def _stats(h, w, targets, inv_temp, chunk_size):
  """Per token: log-normaliser, target logit, expected logit (all [N] float32)."""
  n = h.shape[0]

  def body(carry, w_c, start):
    m, s, ez_sum, tgt = carry
    z = _logits(h, w_c, inv_temp)
    m_new = jnp.maximum(m, jnp.max(z, axis=-1))
    scale = jnp.exp(m - m_new)
    e = jnp.exp(z - m_new[:, None])
    s = s * scale + jnp.sum(e, axis=-1)
    ez_sum = ez_sum * scale + jnp.sum(e * z, axis=-1)
    hit = (targets - start)[:, None] == jnp.arange(z.shape[1])[None, :]
    tgt = tgt + jnp.sum(jnp.where(hit, z, 0.0), axis=-1)
    return (m_new, s, ez_sum, tgt), None

  init = (
    jnp.full((n,), -jnp.inf, F32),
    jnp.zeros((n,), F32),
    jnp.zeros((n,), F32),
    jnp.zeros((n,), F32),
  )
  (m, s, ez_sum, tgt), _, _ = _scan_chunks(body, init, w, chunk_size)
  return m + jnp.log(s), tgt, ez_sum / s


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _logp_entropy(h, w, targets, inv_temp, chunk_size):
  logz, tgt, ez = _stats(h, w, targets, inv_temp, chunk_size)
  return tgt - logz, logz - ez


def _fwd(h, w, targets, inv_temp, chunk_size):
  logz, tgt, ez = _stats(h, w, targets, inv_temp, chunk_size)
  return (tgt - logz, logz - ez), (h, w, targets, logz, ez)


def _bwd(inv_temp, chunk_size, res, cotangents):
  h, w, targets, logz, ez = res
  g_lp, g_ent = (g.astype(F32) for g in cotangents)
  size, n_full, tail = _chunk_plan(w.shape[1], chunk_size)

  def body(carry, w_c, start):
    dh, dw = carry
    z = _logits(h, w_c, inv_temp)
    p = jnp.exp(z - logz[:, None])
    hit = (targets - start)[:, None] == jnp.arange(z.shape[1])[None, :]
    g_z = g_lp[:, None] * (hit.astype(F32) - p) - g_ent[:, None] * p * (z - ez[:, None])
    it = inv_temp if isinstance(inv_temp, float) else inv_temp[:, None]
    g_z = (g_z * it).astype(h.dtype)  # [N, C], through z = h @ w / tau
    dh = dh + jnp.dot(g_z, w_c.astype(h.dtype).T, preferred_element_type=F32)
    dw_c = jnp.dot(h.T, g_z, preferred_element_type=F32).astype(dw.dtype)  # [D, C]
    dw = jax.lax.dynamic_update_slice_in_dim(dw, dw_c, start, axis=1)
    return (dh, dw), None

  init = (jnp.zeros(h.shape, F32), jnp.zeros(w.shape, w.dtype))
  (dh, dw), _, _ = _scan_chunks(body, init, w, chunk_size)
  return dh.astype(h.dtype), dw, None


_logp_entropy.defvjp(_fwd, _bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _logp_entropy_tok(h, w, targets, inv_temp_n, chunk_size):
  """_logp_entropy with a per-token inverse temperature [N] (no gradient flows into it)."""
  logz, tgt, ez = _stats(h, w, targets, inv_temp_n, chunk_size)
  return tgt - logz, logz - ez


def _fwd_tok(h, w, targets, inv_temp_n, chunk_size):
  logz, tgt, ez = _stats(h, w, targets, inv_temp_n, chunk_size)
  return (tgt - logz, logz - ez), (h, w, targets, inv_temp_n, logz, ez)


def _bwd_tok(chunk_size, res, cotangents):
  h, w, targets, inv_temp_n, logz, ez = res
  dh, dw, _ = _bwd(inv_temp_n, chunk_size, (h, w, targets, logz, ez), cotangents)
  return dh, dw, None, jnp.zeros_like(inv_temp_n)


_logp_entropy_tok.defvjp(_fwd_tok, _bwd_tok)


def token_logprobs(
  h,
  w,
  targets,
  *,
  temperature=1.0,
  chunk_size=8192,
  with_entropy=False,
  inv_temperature=None,
  split_width=True,
):
  """log softmax(h @ w / temperature)[target] for every position, in vocabulary chunks.

  Differentiable in h and w (custom VJP; no gradient flows into inv_temperature).

  Args:
    h: [..., D] hidden states.
    w: [D, V] output embedding.
    targets: [...] int token ids.
    temperature: float tau > 0 (ValueError otherwise); ignored when inv_temperature is given.
    chunk_size: vocabulary columns per chunk.
    with_entropy: also return the entropy of each position's distribution.
    inv_temperature: None, or [...] (targets' shape) per-position 1/tau replacing `temperature`.
    split_width: the layout on a mesh (comment in the body); no effect without one.
  Returns:
    logp [...] float32, or (logp, entropy [...] float32) with with_entropy=True.
  """
  lead = targets.shape
  # On a mesh (parallel/sharding.on_mesh), split_width=True: keep the width split over fsdp, as
  # the output embedding's rows are, so each chip projects its slice and only the [N, chunk]
  # partial logits are summed; the backward then needs no communication. For the few response
  # positions scored here (N ~ rows x 32) that moves far less than gathering the [D, V] embedding
  # and reducing its gradient (7B: 1.1 GB + 2.2 GB per micro-batch). split_width=False: the
  # positions over (data, fsdp), the width whole, so the embedding is gathered as FSDP gathers
  # every other weight: the right trade when every position is scored (LM training, N = rows x
  # T), where summing [N, V] partial logits would move far more than the embedding.
  h2 = h.reshape(-1, h.shape[-1])
  h2 = (
    shard_activation(h2, "data", "fsdp")
    if split_width
    else shard_activation(h2, ("data", "fsdp"), None)
  )
  t2 = targets.reshape(-1).astype(jnp.int32)
  if inv_temperature is not None:
    it = jnp.broadcast_to(jnp.asarray(inv_temperature, F32), lead).reshape(-1)
    logp, ent = _logp_entropy_tok(h2, w, t2, it, int(chunk_size))
    logp = logp.reshape(lead)
    return (logp, ent.reshape(lead)) if with_entropy else logp
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  logp, ent = _logp_entropy(h2, w, t2, 1.0 / float(temperature), int(chunk_size))
  logp = logp.reshape(lead)
  return (logp, ent.reshape(lead)) if with_entropy else logp


def naive_token_logprobs(
  h, w, targets, *, temperature=1.0, with_entropy=False, inv_temperature=None
):
  """Reference: the full [..., V] logits, float32. For tests and benchmarks.

  Args:
    h, w, targets, temperature, with_entropy, inv_temperature: as token_logprobs.
  Returns:
    logp [...] float32, or (logp, entropy [...] float32) with with_entropy=True.
  """
  z = jnp.einsum("...d,dv->...v", h, w.astype(h.dtype), preferred_element_type=F32)
  z = z / temperature if inv_temperature is None else z * jnp.asarray(inv_temperature)[..., None]
  logp_all = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  if not with_entropy:
    return logp
  return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)


def response_logprobs(
  params,
  config,
  tokens_bl,
  attn_bl,
  response_len,
  *,
  temperature=1.0,
  chunk_size=8192,
  with_entropy=False,
):
  """Log-probs of the last `response_len` positions of each row (the response block).

  The response occupies columns L-R .. L-1 in every row. Only the R hidden states that predict
  them go through the vocabulary projection.

  Args:
    params: the model's params (model/llama.py).
    config: its LlamaConfig.
    tokens_bl: [B, L] int token ids: prompt left-padded, response right-padded (see rl/batch.py).
    attn_bl: [B, L] attention mask, 1 on real tokens.
    response_len: R, a Python int.
    temperature, chunk_size, with_entropy: as token_logprobs.
  Returns:
    [B, R] float32 log-probs, or ([B, R], entropy [B, R]) with with_entropy=True.
  """
  length = tokens_bl.shape[1]
  hidden = llama.forward(params, config, tokens_bl, attn_bl, return_hidden=True)  # [B, L, D]
  h_brd = hidden[:, length - response_len - 1 : length - 1]
  targets_br = tokens_bl[:, length - response_len :]
  w_dv = llama.output_embedding(params, config)
  return token_logprobs(
    h_brd,
    w_dv,
    targets_br,
    temperature=temperature,
    chunk_size=chunk_size,
    with_entropy=with_entropy,
  )
