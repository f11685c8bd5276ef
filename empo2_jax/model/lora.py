"""LoRA adapters (Hu et al., arXiv 2106.09685) on the decoder's projections, in peft's conventions.

A target projection W [in, out] gains two fp32 matrices and its output becomes

    y = x @ W + (alpha / r) * (x @ A) @ B        A [in, r], B [r, out]

with r = LlamaConfig.lora_rank and alpha = lora_alpha (peft's `scaling`). A starts as peft's
kaiming-uniform draw (uniform in +-1/sqrt(in)), B at zero, so a fresh adapter leaves the model
unchanged. The adapters live in params["layers"] beside the weights they adapt, stacked over the
L layers like them:

  <w>_lora_a [L, in, r]   <w>_lora_b [L, r, out]    for w in wq wk wv wo w_gate w_up w_down

so the scanned forward, split_layers and the sharding rules see them as ordinary layer leaves. A
tree with adapters trains only them (`trainable`: the update, the optimizer state and the
checkpoint hold the adapters alone); the base stays frozen in LlamaConfig.param_dtype (bf16 is
allowed: it is never updated). A tree without adapters is the base model: the KL reference (the
adapters off), and what `merge` returns for export. The sampler applies the adapters unmerged:
bench/lora_sampler.py (SmolLM2-135M, rank 16, 8 rows of 400-token prompts + 32 new tokens, a
loaded 2-core machine) timed a turn at 18.8 / 16.6 s unmerged against 22.3 / 16.4 s merging first
(the merge 1.0-1.2 s of it): no faster either way, and unmerged holds no second copy of the
weights.

Targets use peft's module names (q_proj ... down_proj, or "all-linear": every projection in the
decoder layers, not the output embedding, as peft's "all-linear"). peft's on-disk layout
(`peft_tensors`): base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight = A[i].T [r,
in], ...lora_B.weight = B[i].T [out, r], with adapter_config.json's r, lora_alpha and
target_modules; transformers + peft load it onto the base checkpoint.

Why no library: qwix's LoRA (the JAX one tunix uses) installs here but works by model surgery on
flax Linen / NNX modules (it intercepts their dot_generals by module path); this model is pure
functions over a dict pytree with scanned layers, so there is nothing for it to intercept. peft is
PyTorch. The code here is the few functions that LoRA is over our pytree; the tests hold it against
peft + transformers (tests/model/test_lora.py). No dropout on the adapters' input: the update has
no per-step random key (it is a pure function of the state and the batch) and RL recipes on LoRA
(verl, tunix's GRPO) run without it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Sequence

import numpy as np

import jax
import jax.numpy as jnp

# peft module name -> our weight name (model/llama.py's params)
TARGETS = {
  "q_proj": "wq",
  "k_proj": "wk",
  "v_proj": "wv",
  "o_proj": "wo",
  "gate_proj": "w_gate",
  "up_proj": "w_up",
  "down_proj": "w_down",
}
ALL_LINEAR = "all-linear"
_HF_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn"}
_HF_BLOCK.update(o_proj="self_attn", gate_proj="mlp", up_proj="mlp", down_proj="mlp")
_ADAPTER = re.compile(r"_lora_[ab]$")


def parse_targets(spec: str | Sequence[str]) -> tuple[str, ...]:
  """'all-linear', 'q_proj,v_proj' or a sequence of peft names -> the names in TARGETS order;
  ValueError naming the valid ones for anything else."""
  names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
  names = [n for n in names if n]
  if names == [ALL_LINEAR]:
    return tuple(TARGETS)
  bad = sorted(set(names) - set(TARGETS))
  if bad or not names:
    raise ValueError(
      f"model.lora_targets={spec!r}: unknown {bad or 'empty'}; valid: {ALL_LINEAR} or a "
      f"comma-separated subset of {','.join(TARGETS)}"
    )
  return tuple(t for t in TARGETS if t in names)


def is_adapter(name: str) -> bool:
  """Whether a layer key ("wq_lora_a") is an adapter matrix."""
  return bool(_ADAPTER.search(name))


def adapter_shapes(config) -> dict[str, tuple[int, ...]]:
  """{"wq_lora_a": (L, in, r), "wq_lora_b": (L, r, out), ...} of config's targets."""
  c, r = config, config.lora_rank
  d, f, q, kv = (
    c.hidden_size,
    c.intermediate_size,
    c.num_heads * c.head_dim,
    c.num_kv_heads * c.head_dim,
  )
  # [in, out] of each weight, as in model/llama.param_shapes
  dims = {"wq": (d, q), "wk": (d, kv), "wv": (d, kv), "wo": (q, d)}
  dims.update(w_gate=(d, f), w_up=(d, f), w_down=(f, d))
  out = {}
  for target in c.lora_targets:
    w = TARGETS[target]
    out[f"{w}_lora_a"] = (c.num_layers, dims[w][0], r)
    out[f"{w}_lora_b"] = (c.num_layers, r, dims[w][1])
  return out


def init_adapters(config, rng: jax.Array) -> dict[str, jax.Array]:
  """Fresh fp32 adapters: A ~ U(+-1/sqrt(in)) (peft's kaiming_uniform_(a=sqrt(5))), B = 0."""
  shapes = adapter_shapes(config)
  keys = jax.random.split(rng, max(1, len(shapes)))
  out = {}
  for key, (name, shape) in zip(keys, sorted(shapes.items())):
    if name.endswith("_a"):
      bound = 1.0 / np.sqrt(shape[1])
      out[name] = jax.random.uniform(key, shape, jnp.float32, -bound, bound)
    else:
      out[name] = jnp.zeros(shape, jnp.float32)
  return out


def with_adapters(params: dict, config, rng: jax.Array) -> dict:
  """params plus fresh adapters when config.lora_rank > 0 (unchanged otherwise)."""
  if not config.lora_rank:
    return params
  return dict(params, layers={**params["layers"], **init_adapters(config, rng)})


def split(params: dict) -> tuple[dict, dict]:
  """(adapters {"layers": {...}}, base): the adapter leaves and everything else ({} and params
  when there are none)."""
  layers = params.get("layers") if isinstance(params, dict) else None
  if not isinstance(layers, dict):  # split layers, or a tree that is not a model's
    return {}, params
  adapters = {k: v for k, v in layers.items() if is_adapter(k)}
  if not adapters:
    return {}, params
  base = dict(params, layers={k: v for k, v in layers.items() if not is_adapter(k)})
  return {"layers": adapters}, base


def join(adapters: dict, base: dict) -> dict:
  """Inverse of split (and of trainable: join(params, {}) is params)."""
  if not adapters or not base:
    return base or adapters
  return dict(base, layers={**base["layers"], **adapters["layers"]})


def trainable(params: dict) -> tuple[dict, dict]:
  """(what the update trains, what it holds fixed): (adapters, base) for a tree with adapters,
  (params, {}) for full fine-tuning. join(*trainable(p)) == p either way."""
  adapters, base = split(params)
  return (adapters, base) if adapters else (params, {})


def delta(x: jax.Array, layer: dict, weight: str, scale: float, dtype) -> jax.Array | None:
  """scale * (x @ A) @ B of `weight`'s adapter in `layer` (one layer's leaves) in `dtype`, or
  None where it has none."""
  a = layer.get(f"{weight}_lora_a")
  if a is None:
    return None
  return scale * ((x @ a.astype(dtype)) @ layer[f"{weight}_lora_b"].astype(dtype))


def add_deltas(x: jax.Array, outs: list, layer: dict, weights: Sequence[str], scale, dtype):
  """outs[i] (= x @ weights[i]) plus that weight's adapter delta where the layer has one."""
  deltas = [delta(x, layer, w, scale, dtype) for w in weights]
  return [o if d is None else o + d for o, d in zip(outs, deltas)]


def merge(params: dict, config) -> dict:
  """The base tree with every adapter folded in: W + (alpha / r) A @ B, computed in fp32 and
  stored in W's dtype (a bf16 base rounds the sum). A tree without adapters is returned as is."""
  adapters, base = split(params)
  if not adapters:
    return params
  layers = dict(base["layers"])
  for name, a in adapters["layers"].items():
    if name.endswith("_lora_a"):
      w = name[: -len("_lora_a")]
      b = adapters["layers"][f"{w}_lora_b"]
      ab = jnp.einsum("lir,lro->lio", a, b, precision=jax.lax.Precision.HIGHEST)
      layers[w] = (layers[w].astype(jnp.float32) + config.lora_scale * ab).astype(layers[w].dtype)
  return dict(base, layers=layers)


@jax.jit
def _leaf_sums(leaves):
  """Two position-weighted uint32 sums of each leaf's bits (a checksum computed where the
  leaves live, sharded or not)."""
  out = []
  for x in leaves:
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)
    i, stride = jnp.zeros(x.shape, jnp.uint32), 1  # each element's flat index, mod 2^32, built
    for d in reversed(range(x.ndim)):  # from iotas: no reshape that would gather a sharded leaf
      i = i + jax.lax.broadcasted_iota(jnp.uint32, x.shape, d) * jnp.uint32(stride % 2**32)
      stride *= x.shape[d]
    mix = i * jnp.uint32(2654435761) + jnp.uint32(1)  # Knuth's multiplicative hash of the index
    out.append(jnp.stack([jnp.sum(bits * mix), jnp.sum(bits ^ (i * jnp.uint32(40503)))]))
  return out


def fingerprint(params: dict) -> str:
  """A hex digest of a params tree's names, shapes, dtypes and bits: checkpoints of a LoRA run
  record their base's, and a resume or an export checks the base it loads against it."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  sums = jax.device_get(_leaf_sums([x for _, x in flat]))
  h = hashlib.sha256()
  for (path, x), s in zip(flat, sums):
    h.update(f"{jax.tree_util.keystr(path)}:{tuple(x.shape)}:{x.dtype}:".encode())
    h.update(np.asarray(s, np.uint32).tobytes())
  return h.hexdigest()


def peft_tensors(params: dict, config) -> dict[str, np.ndarray]:
  """The adapters in peft's safetensors layout (module docstring), fp32 numpy."""
  adapters = split(params)[0].get("layers", {})
  out = {}
  for target in config.lora_targets:
    w = TARGETS[target]
    a, b = np.asarray(adapters[f"{w}_lora_a"]), np.asarray(adapters[f"{w}_lora_b"])
    for i in range(a.shape[0]):
      prefix = f"base_model.model.model.layers.{i}.{_HF_BLOCK[target]}.{target}"
      out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[i].T, np.float32)
      out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[i].T, np.float32)
  return out


def peft_config(config, base_model: str = "") -> dict[str, Any]:
  """adapter_config.json for peft's LoraConfig."""
  return {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base_model,
    "r": config.lora_rank,
    "lora_alpha": config.lora_alpha,
    "lora_dropout": 0.0,
    "target_modules": list(config.lora_targets),
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "inference_mode": True,
  }


__all__ = [
  "ALL_LINEAR",
  "TARGETS",
  "add_deltas",
  "adapter_shapes",
  "fingerprint",
  "init_adapters",
  "is_adapter",
  "join",
  "merge",
  "parse_targets",
  "peft_config",
  "peft_tensors",
  "split",
  "trainable",
  "with_adapters",
]
