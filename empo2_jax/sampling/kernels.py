"""Pure device functions of the sampler: token choice, one prefill chunk, the decode loop.

Everything here is traced inside the jitted functions of `sampler.Engine`; nothing is jitted here.

Sampling distribution (what the returned log-probs are measured under):
  greedy  (temperature == 0): token = argmax(logits); log-prob = log_softmax(logits)[token], i.e.
          under the unmodified model distribution (a delta would always give 0).
  sample  (temperature > 0): x = logits / temperature; if top_k > 0 keep the k largest x (by rank,
          so ties never let more than k through); then if top_p < 1 keep the smallest set of the
          most likely remaining tokens whose renormalised mass reaches top_p (the top token is
          always
          kept); everything else gets -inf. token ~ softmax(x_filtered); log-prob =
          log_softmax(x_filtered)[token]. Same order as transformers / vLLM (temperature, top-k,
          then top-p on the renormalised top-k distribution).
  A draw inverts the cumulative distribution at one uniform number per row (`categorical`), in two
  levels (blocks of CDF_BLOCK tokens, then the tokens of the chosen block): one random number a
  row instead of a Gumbel number per vocabulary entry, which on the CPU costs more than the rest
  of the step's non-matmul work.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from empo2_jax.model import llama
from empo2_jax.model.configs import LlamaConfig

MODES = ("greedy", "sample", "filter")  # filter = sample with top-k and/or top-p
CDF_BLOCK = 256


def _last_positive(p: jax.Array) -> jax.Array:
  """The index of the last entry of p [N] above zero (0 if none)."""
  return jnp.max(jnp.where(p > 0, jnp.arange(p.shape[-1]), 0))


def categorical(key: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One index drawn from softmax(x) for x [V] (entries may be -inf; one must be finite), and
  its log-probability log_softmax(x)[index] (from the same pass over exp(x - max)). The index is
  the first whose cumulative probability exceeds u * total, u ~ U[0, 1), found among the
  CDF_BLOCK-wide blocks' sums, then within the chosen block. Only indices of nonzero probability
  can come out (where rounding puts u * total past the last sum, the last such index)."""
  v = x.shape[-1]
  nb = -(-v // CDF_BLOCK)
  top = jnp.max(x)
  p = jnp.exp(x - top)
  p = jnp.pad(p, (0, nb * CDF_BLOCK - v)).reshape(nb, CDF_BLOCK)
  block_mass = p.sum(-1)
  block_cdf = jnp.cumsum(block_mass)
  u = jax.random.uniform(key, (), jnp.float32) * block_cdf[-1]
  blk = jnp.minimum(jnp.sum(block_cdf <= u), _last_positive(block_mass))
  rest = u - (block_cdf[blk] - block_mass[blk])
  row = p[blk]
  i = jnp.minimum(jnp.sum(jnp.cumsum(row) <= rest), _last_positive(row))
  idx = (blk * CDF_BLOCK + i).astype(jnp.int32)
  return idx, x[idx] - top - jnp.log(block_cdf[-1])


def mode_for(temperature: float, top_p: float, top_k: int) -> str:
  """The sampling mode (one of MODES) of the settings; ValueError unless temperature >= 0,
  0 < top_p <= 1 and top_k >= 0."""
  if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
    raise ValueError(
      f"bad sampling settings temperature={temperature} top_p={top_p} "
      f"top_k={top_k}: need temperature >= 0, 0 < top_p <= 1, top_k >= 0"
    )
  if temperature == 0:
    return "greedy"
  return "filter" if (top_p < 1 or top_k > 0) else "sample"


def filter_sorted(x_bv: jax.Array, top_p: jax.Array, top_k: jax.Array):
  """Top-k then top-p in sorted space (module docstring).

  Args:
    x_bv: [B, V] float32 logits already divided by the temperature.
    top_p: float32 scalar in (0, 1].
    top_k: int32 scalar; <= 0: no top-k.
  Returns:
    (xs, order): [B, V] the logits sorted in descending order with the filtered-out entries
    -inf, and [B, V] the token id at each sorted position.
  """
  v = x_bv.shape[-1]
  order = jnp.argsort(-x_bv, axis=-1)  # descending, stable
  xs = jnp.take_along_axis(x_bv, order, axis=-1)
  rank = jnp.arange(v)[None, :]
  keep = (top_k <= 0) | (rank < top_k)
  xs = jnp.where(keep, xs, -jnp.inf)
  probs = jax.nn.softmax(xs, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = keep & ((mass_before < top_p) | (rank == 0))
  return jnp.where(keep, xs, -jnp.inf), order


def choose(logits_bv: jax.Array, keys_b: jax.Array, step, temperature, top_p, top_k, mode: str):
  """One token per row, under the sampling distribution of the module docstring.

  Args:
    logits_bv: [B, V] logits of the next token.
    keys_b: [B] typed keys (one per row).
    step: int scalar, folded into each row's key (the position).
    temperature: float32 scalar (unused when greedy).
    top_p: float32 scalar (used in "filter" mode).
    top_k: int32 scalar (used in "filter" mode).
    mode: one of MODES (mode_for); static.
  Returns:
    (tokens [B] int32, logprobs [B] float32 of those tokens under that distribution).
  """
  logits_bv = logits_bv.astype(jnp.float32)
  if mode == "greedy":
    tok = jnp.argmax(logits_bv, axis=-1)
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits_bv, -1), tok[:, None], -1)[:, 0]
    return tok.astype(jnp.int32), lp
  x = logits_bv / temperature
  step_keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_b)
  draw = jax.vmap(categorical)
  if mode == "sample":
    return draw(step_keys, x)
  xs, order = filter_sorted(x, top_p, top_k)
  j, lp = draw(step_keys, xs)
  tok = jnp.take_along_axis(order, j[:, None], -1)[:, 0]
  return tok.astype(jnp.int32), lp


def logits_from_hidden(params, config: LlamaConfig, hidden_bd: jax.Array) -> jax.Array:
  """[B, D] final hidden states -> [B, V] float32 logits (computed in config's compute dtype; by
  the decode kernels where a decode step uses them, llama.decode_kernels)."""
  return llama.logits(params, config, hidden_bd, kernels=llama.decode_kernels(config))


def prefill_chunk(
  params, config: LlamaConfig, cache, hidden_bd, tokens_bc, mask_bc, start_b, end_b, rows=None
):
  """Write one right-padded chunk of new tokens at slots start_b.. of each row.

  Args:
    params: the model's params (model/llama.py).
    config: its LlamaConfig.
    cache: the KV cache (model/kv_cache.py module docstring).
    hidden_bd: [B, D] each row's current final hidden state; with `rows`, the chunk's rows' state.
    tokens_bc: [B, C] int32 new tokens, right-padded.
    mask_bc: [B, C] 1 on the real new tokens.
    start_b: [B] int32 tokens the row already has in cache (also their positions).
    end_b: [B] int32 index in this chunk of the row's last new token, or -1 if its prompt does
      not end here: those rows keep their previous final hidden state.
    rows: None, or [B] int32 the cache rows the chunk's rows extend (the cache may hold more).
  Returns:
    (cache, hidden [B, D]): the updated cache, and each row's final hidden state.
  """
  c = tokens_bc.shape[1]
  positions = start_b[:, None] + jnp.arange(c, dtype=jnp.int32)[None, :]
  hidden, cache = llama.forward(
    params,
    config,
    tokens_bc,
    mask_bc,
    positions=positions,
    return_hidden=True,
    cache=cache,
    cache_index=start_b,
    cache_rows=rows,
  )
  last = jnp.take_along_axis(hidden, jnp.maximum(end_b, 0)[:, None, None], axis=1)[:, 0]
  return cache, jnp.where((end_b >= 0)[:, None], last.astype(hidden_bd.dtype), hidden_bd)


def decode(
  params,
  config: LlamaConfig,
  cache,
  hidden_bd,
  length_b,
  active_b,
  keys_b,
  temperature,
  top_p,
  top_k,
  stop_ids,
  max_new,
  *,
  mode: str,
  buffer: int,
):
  """Sample up to `max_new` (<= buffer) tokens per active row, stopping rows independently.

  A sampled token is fed back (written to the cache) only when the row continues, so on return a
  row's cache holds prompt + tokens[:-1]. A row stops at a stop id or after max_new tokens.

  Args:
    params: the model's params (model/llama.py).
    config: its LlamaConfig.
    cache: the KV cache (model/kv_cache.py module docstring).
    hidden_bd: [B, D] final hidden state of each row's last prompt token.
    length_b: [B] int32 tokens in the row's cache (the prompt).
    active_b: [B] bool; inactive rows sample nothing.
    keys_b: [B] typed keys (one per row).
    temperature, top_p, top_k: scalars, as `choose`.
    stop_ids: [N] int32 (-1 entries never match).
    max_new: int32 scalar, <= buffer.
    mode: one of MODES; static.
    buffer: the output width; static.
  Returns:
    (cache, tokens [B, buffer] int32 (-1 past the end), logprobs [B, buffer] float32,
    counts [B] int32 tokens sampled, length_b [B] int32 tokens now in each row's cache).
  """
  b = hidden_bd.shape[0]

  def is_stop(tok):
    return jnp.any(tok[:, None] == stop_ids[None, :], axis=-1)

  logits = logits_from_hidden(params, config, hidden_bd)
  tok, lp = choose(logits, keys_b, 0, temperature, top_p, top_k, mode)
  out_tok = jnp.full((b, buffer), -1, jnp.int32).at[:, 0].set(jnp.where(active_b, tok, -1))
  out_lp = jnp.zeros((b, buffer), jnp.float32).at[:, 0].set(jnp.where(active_b, lp, 0.0))
  count = active_b.astype(jnp.int32)
  done = ~active_b | is_stop(tok) | (count >= max_new)

  def cond(carry):
    step, _, _, done, *_ = carry
    return (step < max_new) & ~jnp.all(done)

  def body(carry):
    step, cache, tok, done, length, count, out_tok, out_lp = carry
    feed = ~done
    logits, cache = llama.forward(
      params,
      config,
      tok[:, None],
      feed[:, None].astype(jnp.int32),
      positions=length[:, None],
      cache=cache,
      cache_index=length,
    )
    length = length + feed
    new, lp = choose(logits[:, 0], keys_b, step, temperature, top_p, top_k, mode)
    col = jnp.arange(buffer)[None, :] == step
    out_tok = jnp.where(col & feed[:, None], new[:, None], out_tok)
    out_lp = jnp.where(col & feed[:, None], lp[:, None], out_lp)
    count = count + feed
    done = done | (feed & (is_stop(new) | (count >= max_new)))
    tok = jnp.where(feed, new, tok)
    return step + 1, cache, tok, done, length, count, out_tok, out_lp

  carry = (jnp.int32(1), cache, tok, done, length_b, count, out_tok, out_lp)
  _, cache, _, _, length, count, out_tok, out_lp = jax.lax.while_loop(cond, body, carry)
  return cache, out_tok, out_lp, count, length
