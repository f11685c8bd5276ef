"""Hugging Face Llama / Qwen2 checkpoints (and GGUF files) <-> our params, without torch.

`load_checkpoint(dir)` reads config.json and model.safetensors (or shards listed in
model.safetensors.index.json) tensor by tensor (`safetensors_io`, through the safetensors
package): each tensor is read, cast to the target dtype and written into its slot of a
preallocated stacked array, so host memory holds one copy of the params plus one tensor in
flight. A malformed file raises CheckpointError naming the file and the tensor.
`load_checkpoint("model.gguf")` hands over to `gguf.load_gguf` (llama.cpp files, dequantized).
`save_checkpoint(dir, config, params)` writes files that transformers' AutoModelForCausalLM loads
(LlamaForCausalLM or Qwen2ForCausalLM, by `config.attention_bias`). Paths may be local or
anything etils.epath opens (gs://): a remote directory is streamed to a temporary local copy that
is removed when the load is done, and a remote output directory is written locally, uploaded and
removed (empo2_jax/remote.py).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import numpy as np

from empo2_jax import remote
from empo2_jax.model import lora
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.model.llama import param_shapes
from empo2_jax.model.safetensors_io import (  # noqa: F401  (re-exported)
  FIX,
  CheckpointError,
  iter_safetensors,
  write_safetensors,
)
from empo2_jax.model.weights import NP_DTYPES, check_complete, check_dtype

# HF tensor name -> (our path, per-layer?, transpose?)
_LAYER_MAP = {
  "input_layernorm.weight": ("attn_norm", False),
  "self_attn.q_proj.weight": ("wq", True),
  "self_attn.q_proj.bias": ("bq", False),
  "self_attn.k_proj.weight": ("wk", True),
  "self_attn.k_proj.bias": ("bk", False),
  "self_attn.v_proj.weight": ("wv", True),
  "self_attn.v_proj.bias": ("bv", False),
  "self_attn.o_proj.weight": ("wo", True),
  "post_attention_layernorm.weight": ("mlp_norm", False),
  "mlp.gate_proj.weight": ("w_gate", True),
  "mlp.up_proj.weight": ("w_up", True),
  "mlp.down_proj.weight": ("w_down", True),
}
_TOP_MAP = {
  "model.embed_tokens.weight": ("embed", False),
  "model.norm.weight": ("final_norm", False),
  "lm_head.weight": ("lm_head", True),
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def is_gguf(path: str) -> bool:
  return str(path).lower().endswith(".gguf")


def _read_json(file: str) -> Any:
  try:
    with open(file, encoding="utf-8") as f:
      return json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{file}: not valid JSON ({e}); {FIX}") from e


def load_config(path: str, **overrides: Any) -> LlamaConfig:
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(
      f"{path}: no config.json; pass a Hugging Face Llama/Qwen2 checkpoint "
      "directory or a .gguf file"
    )
  cfg = _read_json(cfg_path)
  if not isinstance(cfg, dict):
    raise CheckpointError(f"{cfg_path}: not a JSON object; {FIX}")
  return LlamaConfig.from_hf_dict(cfg, **overrides)


def _weight_files(path: str) -> dict[str, set[str] | None]:
  """{shard file: tensor names the index places in it (None without an index)}."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(index):
    weight_map = _read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
      raise CheckpointError(f"{index}: has no weight_map of tensor name -> file; {FIX}")
    files = sorted(set(weight_map.values()))
    missing = [x for x in files if not os.path.exists(os.path.join(path, x))]
    if missing:
      raise CheckpointError(f"{path}: shards listed in the index are missing: {missing}; {FIX}")
    return {os.path.join(path, x): {k for k, v in weight_map.items() if v == x} for x in files}
  if os.path.exists(single):
    return {single: None}
  raise CheckpointError(
    f"{path}: no model.safetensors or model.safetensors.index.json "
    "(only safetensors checkpoints are supported; convert .bin files first)"
  )


def load_checkpoint(path: str, dtype: str = "float32", **config_overrides: Any):
  """Read a HF Llama/Qwen2 directory or a .gguf file -> (config, params as numpy arrays in
  `dtype`). `config_overrides` replace config fields (e.g. compute_dtype, remat)."""
  check_dtype(dtype)
  if is_gguf(path):
    from empo2_jax.model import gguf

    return gguf.load_gguf(path, dtype=dtype, **config_overrides)
  # gs://: the directory is streamed to a temporary copy, removed when the load is done; errors
  # name the remote path, not the copy
  with remote.local_dir(path, suffixes=remote.WEIGHT_SUFFIXES) as local:
    try:
      return _load_dir(local, dtype, config_overrides)
    except CheckpointError as e:
      if local == str(path):
        raise
      raise CheckpointError(str(e).replace(local, str(path).rstrip("/"))) from e


def _load_dir(path: str, dtype: str, config_overrides: dict):
  """load_checkpoint for a local directory."""
  config = load_config(path, param_dtype=dtype, **config_overrides)
  np_dtype = NP_DTYPES[dtype]
  shapes = param_shapes(config)
  params = {"embed": None, "final_norm": None, "layers": {}}
  params["layers"] = {k: np.empty(s, np_dtype) for k, s in shapes["layers"].items()}
  seen: set[str] = set()
  files = _weight_files(path)
  for file, listed in files.items():
    names = set()
    for name, arr in iter_safetensors(file):
      _place(params, shapes, config, name, arr, np_dtype, seen, file)
      names.add(name)
    if listed is not None and listed - names:
      raise CheckpointError(
        f"{file}: lacks tensors {sorted(listed - names)[:8]} that "
        f"model.safetensors.index.json places in it; {FIX}"
      )
  where = ", ".join(os.path.basename(f) for f in list(files)[:3]) + (
    ", ..." if len(files) > 3 else ""
  )
  check_complete(path, config, seen, f"checkpoint ({where})", hf_name)
  return config, params


def hf_name(slot: str) -> str:
  """The Hugging Face tensor name of one of our params (`name` or `name.layer`)."""
  ours, _, layer = slot.partition(".")
  if layer:
    hf = next((k for k, (o, _) in _LAYER_MAP.items() if o == ours), None)
    return f"model.layers.{layer}.{hf}" if hf else slot
  return next((k for k, (o, _) in _TOP_MAP.items() if o == ours), slot)


def _place(params, shapes, config, name, arr, np_dtype, seen, file):
  def bad(what):
    return CheckpointError(f"{file}: tensor {name}: {what}")

  m = _LAYER_RE.match(name)
  if m:
    layer, rest = int(m.group(1)), m.group(2)
    if rest not in _LAYER_MAP:
      raise bad(f"unexpected (not part of {config.architecture})")
    ours, transpose = _LAYER_MAP[rest]
    if ours not in shapes["layers"]:
      raise bad(
        f"unexpected: config.json says attention_bias={config.attention_bias} "
        f"({config.architecture})"
      )
    if layer >= config.num_layers:
      raise bad(f"layer {layer} >= num_hidden_layers {config.num_layers}")
    want = shapes["layers"][ours][1:]
  elif name in _TOP_MAP:
    ours, transpose = _TOP_MAP[name]
    if ours == "lm_head" and config.tie_word_embeddings:
      return  # some exports store the tied head as well; the embedding is authoritative
    want = shapes[ours]
  elif name.endswith("rotary_emb.inv_freq"):
    return
  else:
    raise bad(f"unexpected (not part of {config.architecture})")
  value = arr.T if transpose else arr
  if tuple(value.shape) != tuple(want):
    expect = tuple(reversed(want)) if transpose else tuple(want)  # in the file's layout
    raise bad(
      f"shape {tuple(arr.shape)}, but config.json implies {expect} (our {ours}); "
      f"config.json and the weights disagree: {FIX}"
    )
  if m:
    params["layers"][ours][layer] = value.astype(np_dtype)
    seen.add(f"{ours}.{layer}")
  else:
    params[ours] = np.array(value, dtype=np_dtype)
    seen.add(ours)


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------


def _hf_tensors(config: LlamaConfig, params) -> Iterator[tuple[str, np.ndarray]]:
  def to_np(x):
    return np.asarray(x)

  yield "model.embed_tokens.weight", to_np(params["embed"])
  inv = {ours: (hf, t) for hf, (ours, t) in _LAYER_MAP.items() if ours in params["layers"]}
  for i in range(config.num_layers):
    for ours, (hf, transpose) in inv.items():
      v = to_np(params["layers"][ours][i])
      yield f"model.layers.{i}.{hf}", (v.T if transpose else v)
  yield "model.norm.weight", to_np(params["final_norm"])
  if not config.tie_word_embeddings:
    yield "lm_head.weight", to_np(params["lm_head"]).T


def save_checkpoint(
  path: str, config: LlamaConfig, params, *, max_shard_bytes: int = 4 << 30
) -> None:
  """Write config.json + safetensors (sharded with an index past `max_shard_bytes`); LoRA
  adapters in `params` are merged into their weights first (lora.merge)."""
  params = lora.merge(params, config)
  with remote.writable_dir(path) as local:  # gs://: a temp dir, uploaded, then removed
    shards, current, size = [], {}, 0
    for name, arr in _hf_tensors(config, params):
      arr = np.ascontiguousarray(arr)
      if current and size + arr.nbytes > max_shard_bytes:
        shards.append(current)
        current, size = {}, 0
      current[name] = arr
      size += arr.nbytes
    shards.append(current)
    if len(shards) == 1:
      write_safetensors(os.path.join(local, "model.safetensors"), shards[0])
    else:
      weight_map = {}
      for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(local, fname), shard)
        weight_map.update({k: fname for k in shard})
      total = sum(a.nbytes for s in shards for a in s.values())
      with open(os.path.join(local, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(local, "config.json"), "w") as f:
      json.dump(config.to_hf_dict(), f, indent=1)


def save_lora_adapters(path: str, config: LlamaConfig, params, base_model: str = "") -> None:
  """Write the adapters of `params` in peft's layout (model/lora.py): adapter_model.safetensors
  + adapter_config.json, which peft.PeftModel.from_pretrained loads onto the base model."""
  if not lora.split(params)[0]:
    raise ValueError("these params have no LoRA adapters to write (model.lora_rank is 0)")
  with remote.writable_dir(path) as local:
    write_safetensors(
      os.path.join(local, "adapter_model.safetensors"), lora.peft_tensors(params, config)
    )
    with open(os.path.join(local, "adapter_config.json"), "w") as f:
      json.dump(lora.peft_config(config, base_model), f, indent=1)
