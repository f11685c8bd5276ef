"""Llama-family decoder (Llama, SmolLM2, Qwen2/Qwen2.5) as pure functions over a params pytree.

Qwen2 is Llama plus biases on the q/k/v projections (`LlamaConfig.attention_bias`), so one module
and one config class serve both. Params (layers stacked on a leading axis L so they can be scanned
and sharded by regex):

  embed        [V, D]
  layers/      attn_norm [L, D]; wq [L, D, H*hd]; wk, wv [L, D, K*hd]; wo [L, H*hd, D];
               bq [L, H*hd]; bk, bv [L, K*hd]   (only when attention_bias)
               mlp_norm [L, D]; w_gate, w_up [L, D, F]; w_down [L, F, D]
  final_norm   [D]
  lm_head      [D, V]   (absent when tie_word_embeddings: the embedding is reused)
  layers/<w>_lora_a [L, in, r], <w>_lora_b [L, r, out]: LoRA adapters of weight w (model/lora.py)

Numerics follow Hugging Face's Llama/Qwen2: RMSNorm statistics in float32, the normalised value
cast back to the compute dtype before the weight multiply; RoPE frequencies in float32 from explicit
positions; softmax in float32; Llama 3 frequency scaling (config.rope_scaling) applied to the
float32 inverse frequencies as transformers does.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from empo2_jax.model import cpu_kernels, lora
from empo2_jax.model.attention import flash_attention
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.model.grad_accum import scan_accumulating
from empo2_jax.model.kv_cache import (
  NEG_INF,
  attend_cached,
  attend_cached_kernel,
  write_cache,
  write_rows,
)
from empo2_jax.parallel.sharding import BATCH_AXES, shard_activation

Params = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------------------------


def param_shapes(config: LlamaConfig) -> Params:
  """Shapes of every parameter (the single source for init, loading and sharding)."""
  c = config
  L, D, F, V = c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  layers = {
    "attn_norm": (L, D),
    "wq": (L, D, q),
    "wk": (L, D, kv),
    "wv": (L, D, kv),
    "wo": (L, q, D),
    "mlp_norm": (L, D),
    "w_gate": (L, D, F),
    "w_up": (L, D, F),
    "w_down": (L, F, D),
  }
  if c.attention_bias:
    layers.update(bq=(L, q), bk=(L, kv), bv=(L, kv))
  shapes = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
  if not c.tie_word_embeddings:
    shapes["lm_head"] = (D, V)
  return shapes


def init_params(config: LlamaConfig, rng: jax.Array, std: float = 0.02) -> Params:
  """Random init (normal(std) matrices, zero biases, unit norms) in `config.param_dtype`."""
  shapes = param_shapes(config)
  flat, treedef = jax.tree_util.tree_flatten_with_path(
    shapes, is_leaf=lambda x: isinstance(x, tuple)
  )
  keys = jax.random.split(rng, len(flat))
  leaves = []
  for key, (path, shape) in zip(keys, flat):
    name = jax.tree_util.keystr(path)
    if "norm" in name:
      leaf = jnp.ones(shape, jnp.float32)
    elif "'b" in name and len(shape) <= 2 and "embed" not in name:
      leaf = jnp.zeros(shape, jnp.float32)
    else:
      leaf = std * jax.random.normal(key, shape, jnp.float32)
    leaves.append(leaf.astype(config.jnp_param_dtype))
  return jax.tree_util.tree_unflatten(treedef, leaves)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis: x [..., D], weight [D] -> [..., D] in x's dtype (statistics in
  float32, the normalised value cast back before the weight multiply)."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(x32 * x32, axis=-1, keepdims=True)
  normed = (x32 * jax.lax.rsqrt(var + eps)).astype(x.dtype)
  return weight.astype(x.dtype) * normed


def rope_inv_freq(config: LlamaConfig) -> jax.Array:
  """RoPE inverse frequencies [hd/2] in float32, with Llama 3 scaling when configured."""
  hd = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
  s = config.rope_scaling
  if s is None:
    return inv_freq
  wavelen = 2 * jnp.pi / inv_freq
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor  # beyond: divide
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor  # below: keep
  scaled = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
    s.high_freq_factor - s.low_freq_factor
  )
  blended = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, blended, scaled)


def rope_cos_sin(positions: jax.Array, inv_freq: jax.Array):
  """cos/sin [B, T, hd] in float32 from positions [B, T] and inv_freq [hd/2]."""
  freqs = jnp.einsum(
    "bt,f->btf", positions.astype(jnp.float32), inv_freq, precision=jax.lax.Precision.HIGHEST
  )
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """RoPE, in the rotate-half convention of Hugging Face.

  Args:
    x: [B, T, N, hd] queries or keys (N heads).
    cos, sin: [B, T, hd] float32 (rope_cos_sin).
  Returns:
    [B, T, N, hd] in x's dtype.
  """
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """Position of each token counting only real tokens (left padding gets position 0): attention
  mask [B, T] -> positions [B, T] int32."""
  return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


def _attend(q, k, v, allowed, dtype):
  """q [B,T,H,hd], k/v [B,S,K,hd], allowed [B,T,S] bool -> [B,T,H*hd]."""
  b, t, h, hd = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, hd)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k.astype(dtype)).astype(jnp.float32)
  scores = scores * (hd**-0.5)
  scores = jnp.where(allowed[:, None, None, :, :], scores, NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(dtype))
  return out.reshape(b, t, h * hd)


def _attend_causal(q, k, v, allowed, dtype, block: int):
  """`_attend` for a cache-free forward (T == S, `allowed` within the causal triangle): query
  block [a, b) attends to keys [0, b) only. The skipped keys are disallowed for those queries, so
  real positions get the same result as the full matrix (a query with no allowed key, i.e. left
  padding, averages over the keys it sees: padding outputs are never read)."""
  t = q.shape[1]
  if block <= 0 or t <= block:
    return _attend(q, k, v, allowed, dtype)
  outs = []
  for a in range(0, t, block):
    b = min(a + block, t)
    outs.append(_attend(q[:, a:b], k[:, :b], v[:, :b], allowed[:, a:b, :b], dtype))
  return jnp.concatenate(outs, axis=1)


def decoder_layer(config: LlamaConfig, x, layer, cos, sin, attend, kernels: bool = False):
  """One pre-norm decoder block.

  Args:
    config: LlamaConfig.
    x: [B, T, D] the block's input.
    layer: one layer's params (params["layers"] without the leading L axis).
    cos, sin: [B, T, hd] float32 RoPE tables (rope_cos_sin).
    attend: (q [B, T, H, hd], k, v [B, T, K, hd]) -> (out [B, T, H*hd], aux); does the attention
      (and any cache write).
    kernels: a decode step with model/cpu_kernels.py: the weights whose joint transposed copy the
      layer holds (`with_transposed`, TRANSPOSED) are multiplied in one cpu_kernels.products call.
  Returns:
    (x [B, T, D], aux): the block's output and attend's aux.
  """
  c, dt = config, config.jnp_compute_dtype
  b, t, _ = x.shape

  def w(n):
    return layer[n].astype(dt)

  def mm(y, key):  # y @ each weight of TRANSPOSED[key], plus its LoRA adapter's delta if any
    names = TRANSPOSED[key]
    if kernels and key in layer:
      outs = [o.astype(dt) for o in cpu_kernels.products(y, [w(n) for n in names], layer[key])]
    else:
      outs = [y @ w(n) for n in names]
    return lora.add_deltas(y, outs, layer, names, c.lora_scale, dt)

  def rows(y):  # [B, T, D]: rows split, width whole
    return shard_activation(y, BATCH_AXES, None, None)

  def heads(y):  # [B, T, heads * hd] or [B, T, F]: rows split, heads / MLP hidden over tensor
    return shard_activation(y, BATCH_AXES, None, "tensor")

  x = rows(x)
  h = rms_norm(x, layer["attn_norm"], c.rms_norm_eps)
  q, k, v = (heads(y) for y in mm(h, "wqkv_t"))
  if c.attention_bias:
    q, k, v = q + w("bq"), k + w("bk"), v + w("bv")
  q = q.reshape(b, t, c.num_heads, c.head_dim)
  k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
  v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
  q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
  attn, aux = attend(q, k, v)
  x = rows(x + mm(heads(attn), "wo_t")[0])

  h = rms_norm(x, layer["mlp_norm"], c.rms_norm_eps)
  gate, up = mm(h, "w_gate_up_t")
  mlp = jax.nn.silu(heads(gate)) * heads(up)
  x = rows(x + mm(mlp, "w_down_t")[0])
  return x, aux


def _remat(fn, policy: str):
  if policy == "none":
    return fn
  if policy == "full":
    return jax.checkpoint(fn)
  return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


def split_layers(params: Params) -> Params:
  """params with params["layers"] as a list of per-layer dicts (a copy of the layer weights):
  what the cached forward runs fastest on where slicing a layer out of the stack copies it."""
  layers = params["layers"]
  n = len(next(iter(layers.values())))
  return dict(params, layers=[{k: v[i] for k, v in layers.items()} for i in range(n)])


# A decode step's layer products by input: the key of their joint transposed copy -> the [in, out]
# weights it stacks, in order (the weights that multiply the same input share one kernel call).
TRANSPOSED = {
  "wqkv_t": ("wq", "wk", "wv"),
  "wo_t": ("wo",),
  "w_gate_up_t": ("w_gate", "w_up"),
  "w_down_t": ("w_down",),
}


def with_transposed(params: Params, config: LlamaConfig) -> Params:
  """params plus, per layer, each TRANSPOSED key: its weights joined along the output axis and
  transposed ([sum of outs, in]), and when untied, the output embedding's transpose ("lm_head_t"):
  the layout the decode kernels read in one pass (model/cpu_kernels.py). Works on stacked or split
  layers; costs a second copy of the layer weights."""

  def add(layer):
    return dict(
      layer,
      **{
        key: jnp.swapaxes(jnp.concatenate([layer[n] for n in names], axis=-1), -1, -2)
        for key, names in TRANSPOSED.items()
      },
    )

  layers = params["layers"]
  layers = [add(x) for x in layers] if isinstance(layers, (list, tuple)) else add(layers)
  out = dict(params, layers=layers)
  if not config.tie_word_embeddings:
    out["lm_head_t"] = params["lm_head"].T
  return out


def decode_kernels(config: LlamaConfig) -> bool:
  """Whether a one-token cached forward runs model/cpu_kernels.py (config.decode_kernels, the
  compute dtype and the default backend; trace-time)."""
  return cpu_kernels.use_kernels(config.decode_kernels, config.compute_dtype)


def logits(params: Params, config: LlamaConfig, x: jax.Array, kernels: bool = False) -> jax.Array:
  """[..., D] final hidden states -> [..., V] float32 logits in the compute dtype; with `kernels`,
  through cpu_kernels.products over the [V, D] tied embedding or "lm_head_t" when there is one."""
  dt = config.jnp_compute_dtype
  w = output_embedding(params, config).astype(dt)
  w_t = params["embed"] if config.tie_word_embeddings else params.get("lm_head_t")
  if kernels and w_t is not None:
    return cpu_kernels.products(x.astype(dt), [w], w_t)[0]
  return jnp.einsum("...d,dv->...v", x.astype(dt), w).astype(jnp.float32)


def output_embedding(params: Params, config: LlamaConfig) -> jax.Array:
  """[D, V] matrix that maps final hidden states to logits."""
  if config.tie_word_embeddings:
    return params["embed"].T
  return params["lm_head"]


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------


def forward(
  params: Params,
  config: LlamaConfig,
  tokens: jax.Array,
  attention_mask: jax.Array,
  *,
  positions: Optional[jax.Array] = None,
  return_hidden: bool = False,
  cache: Optional[Params] = None,
  cache_index: Optional[jax.Array] = None,
  cache_rows: Optional[jax.Array] = None,
  layer_grads: Optional[Params] = None,
):
  """The decoder: tokens [B, T] -> logits [B, T, V] float32 (or final hidden states [B, T, D]).

  See the module docstring for the cache contract. With a cache, params["layers"] may also be a
  list of per-layer dicts (`split_layers`): the same result without slicing each layer's weights
  out of the stacked arrays (which XLA:CPU copies).

  Args:
    params: the params pytree (module docstring).
    config: LlamaConfig.
    tokens: [B, T] int32 token ids.
    attention_mask: [B, T] int32, 1 on real tokens.
    positions: [B, T] int32 RoPE positions; None: positions_from_mask (required with a cache).
    return_hidden: return the final-normed hidden states [B, T, D] instead of the logits.
    cache: None, or the KV cache to write the new tokens into and attend over.
    cache_index: [B] int32, with a cache: the slot of each row's first new token.
    cache_rows: None, or [B] int32 (distinct): the cache rows the batch's rows extend (default:
      row b is cache row b); the cache may hold more rows, which stay untouched.
    layer_grads: None, or (cache-free, scanned layers, remat "full") a float32 accumulator shaped
      like params["layers"]; the same output, and differentiating with respect to `layer_grads`
      gives layer_grads + the layers' gradient, added in place layer by layer
      (model/grad_accum.py).
  Returns:
    out ([B, T, V] logits or [B, T, D] hidden), or (out, new_cache) with a cache.
  """
  c, dt = config, config.jnp_compute_dtype
  tokens = jnp.asarray(tokens, jnp.int32)
  attention_mask = jnp.asarray(attention_mask, jnp.int32)
  if positions is None:
    if cache is not None:
      raise ValueError("forward with a cache needs explicit positions")
    positions = positions_from_mask(attention_mask)
  b, t = tokens.shape
  x = params["embed"][tokens].astype(dt)
  cos, sin = rope_cos_sin(positions, rope_inv_freq(c))

  kernels = False
  if cache is None:
    if c.attention_impl == "dense":
      causal = jnp.tril(jnp.ones((t, t), bool))
      allowed = causal[None] & (attention_mask[:, None, :] > 0)

    # The tables and masks every layer reads, passed explicitly (grad_accum's custom VJP takes
    # no closed-over arrays).
    consts = (cos, sin, attention_mask if c.attention_impl == "flash" else allowed)

    def layer_fn(x, layer, consts):
      cos_, sin_, mask = consts

      def attend(q, k, v):
        if c.attention_impl == "flash":
          return flash_attention(q, k, v, mask, block=c.attention_block, dtype=dt), None
        return _attend_causal(q, k, v, mask, dt, c.attention_block), None

      return decoder_layer(c, x, layer, cos_, sin_, attend)[0]

    if layer_grads is not None:
      if not (c.scan_layers and c.remat == "full"):
        raise ValueError(
          "layer_grads needs scanned layers with full remat (config.scan_layers=True, "
          f"remat='full'); got scan_layers={c.scan_layers}, remat={c.remat!r}"
        )
      x = scan_accumulating(layer_fn, x, params["layers"], layer_grads, consts)
    else:
      body = _remat(lambda x, layer: (layer_fn(x, layer, consts), None), c.remat)
      if c.scan_layers:
        x, _ = jax.lax.scan(body, x, params["layers"])
      else:
        for i in range(c.num_layers):
          x, _ = body(x, jax.tree.map(lambda a: a[i], params["layers"]))
    new_mask = kv_out = None
  else:
    if cache_rows is None:
      row_mask = new_mask = write_rows(cache["mask"], attention_mask, cache_index)
    else:
      row_mask = write_rows(cache["mask"][cache_rows], attention_mask, cache_index)
      new_mask = cache["mask"].at[cache_rows].set(row_mask)
    q_slot = cache_index[:, None] + jnp.arange(t)[None, :]  # [B, T]
    # the CPU kernels (model/cpu_kernels.py): a decode step's products and attention, a prefill
    # chunk's attention where its head size has a kernel
    kernels = t == 1 and decode_kernels(c)
    attn_kernels = decode_kernels(c) and (t == 1 or c.head_dim in cpu_kernels.PREFILL_HEAD_DIMS)

    # The cache rides in the carry and each layer scatters its new keys/values into it in place
    # (as scan inputs/outputs, every call would copy the whole [L, B, K, S, hd] cache: decode does
    # one call per token).
    def cached_body(carry, xs):
      h, k_all, v_all = carry
      layer, i = xs

      def attend(q, k, v):
        k2 = write_cache(k_all, i, k, cache_index, cache_rows)
        v2 = write_cache(v_all, i, v, cache_index, cache_rows)
        if attn_kernels and k2.dtype == jnp.float32:
          out = attend_cached_kernel(q, k2, v2, i, cache_rows, q_slot, row_mask, c)
        else:
          out = attend_cached(q, k2, v2, i, cache_rows, q_slot, row_mask, dt, c.cache_block)
        return out, (k2, v2)

      h, (k_all, v_all) = decoder_layer(c, h, layer, cos, sin, attend, kernels=kernels)
      return (h, k_all, v_all), None

    carry = (x, cache["k"], cache["v"])
    if isinstance(params["layers"], (list, tuple)):  # split_layers: one param dict per layer
      for i, layer in enumerate(params["layers"]):
        carry, _ = cached_body(carry, (layer, i))
    elif c.scan_layers:
      carry, _ = jax.lax.scan(cached_body, carry, (params["layers"], jnp.arange(c.num_layers)))
    else:
      for i in range(c.num_layers):
        carry, _ = cached_body(carry, (jax.tree.map(lambda a: a[i], params["layers"]), i))
    x, *kv_out = carry

  x = rms_norm(x, params["final_norm"], c.rms_norm_eps)
  out = x if return_hidden else logits(params, c, x, kernels=kernels)
  if cache is None:
    return out
  return out, {"k": kv_out[0], "v": kv_out[1], "mask": new_mask}
