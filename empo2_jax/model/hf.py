"""Hugging Face Llama / Qwen2 checkpoints (and GGUF files) <-> our params, without torch.

`load_checkpoint(dir)` reads config.json and model.safetensors (or shards listed in
model.safetensors.index.json) tensor by tensor: each tensor is memory-mapped, cast to the target
dtype and written into its slot of a preallocated stacked array, so host memory holds one copy of
the params plus one tensor in flight. `load_checkpoint("model.gguf")` hands over to
`gguf.load_gguf` (llama.cpp files, dequantized). `save_checkpoint(dir, config, params)` writes
files that transformers' AutoModelForCausalLM loads (LlamaForCausalLM or Qwen2ForCausalLM, by
`config.attention_bias`). Paths may be local or anything etils.epath opens (gs://); remote files
are copied to a local temp dir first for memory mapping.
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
from typing import Any, Iterator

import ml_dtypes
import numpy as np

from empo2_jax.model.configs import Qwen2Config
from empo2_jax.model.qwen2 import param_shapes

_ST_DTYPES = {
  "F32": np.float32,
  "F16": np.float16,
  "BF16": ml_dtypes.bfloat16,
  "F64": np.float64,
  "I64": np.int64,
  "I32": np.int32,
}
_NP_TO_ST = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

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


class CheckpointError(ValueError):
  pass


# ---------------------------------------------------------------------------------------------
# safetensors, read and written with numpy only
# ---------------------------------------------------------------------------------------------


def _read_header(path: str):
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  header.pop("__metadata__", None)
  return header, 8 + n


def iter_safetensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
  """Yield (name, read-only memory-mapped array) for every tensor of one file."""
  header, base = _read_header(path)
  mm = np.memmap(path, dtype=np.uint8, mode="r")
  for name, info in header.items():
    if info["dtype"] not in _ST_DTYPES:
      raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    arr = mm[base + start : base + end].view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    yield name, arr


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
  header, offset = {}, 0
  for name, arr in tensors.items():
    nbytes = arr.size * arr.dtype.itemsize
    header[name] = {
      "dtype": _NP_TO_ST[arr.dtype],
      "shape": list(arr.shape),
      "data_offsets": [offset, offset + nbytes],
    }
    offset += nbytes
  header["__metadata__"] = {"format": "pt"}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in tensors.values():
      f.write(np.ascontiguousarray(arr).tobytes())
  os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _local_dir(path: str) -> str:
  """Local directory for `path`; remote (gs://...) directories are copied to a temp dir."""
  if "://" not in str(path):
    return str(path)
  from etils import epath

  src = epath.Path(path)
  dst = tempfile.mkdtemp(prefix="empo2_hf_")
  for f in src.iterdir():
    if f.name.endswith((".json", ".safetensors", ".txt", ".model", ".jinja")):
      (epath.Path(dst) / f.name).write_bytes(f.read_bytes())
  return dst


def is_gguf(path: str) -> bool:
  return str(path).lower().endswith(".gguf")


def load_config(path: str, **overrides: Any) -> Qwen2Config:
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(
      f"{path}: no config.json; pass a Hugging Face Llama/Qwen2 checkpoint "
      "directory or a .gguf file"
    )
  with open(cfg_path) as f:
    return Qwen2Config.from_hf_dict(json.load(f), **overrides)


def _weight_files(path: str) -> list[str]:
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    missing = [x for x in files if not os.path.exists(os.path.join(path, x))]
    if missing:
      raise CheckpointError(f"{path}: shards listed in the index are missing: {missing}")
    return [os.path.join(path, x) for x in files]
  if os.path.exists(single):
    return [single]
  raise CheckpointError(
    f"{path}: no model.safetensors or model.safetensors.index.json "
    "(only safetensors checkpoints are supported; convert .bin files first)"
  )


def load_checkpoint(path: str, dtype: str = "float32", **config_overrides: Any):
  """Read a HF Llama/Qwen2 directory or a .gguf file -> (config, params as numpy arrays in
  `dtype`). `config_overrides` replace config fields (e.g. compute_dtype, remat)."""
  if dtype not in _NP_DTYPES:
    raise ValueError(f"dtype={dtype!r}; valid: {sorted(_NP_DTYPES)}")
  if is_gguf(path):
    from empo2_jax.model import gguf

    return gguf.load_gguf(path, dtype=dtype, **config_overrides)
  path = _local_dir(path)
  config = load_config(path, param_dtype=dtype, **config_overrides)
  np_dtype = _NP_DTYPES[dtype]
  shapes = param_shapes(config)
  params = {"embed": None, "final_norm": None, "layers": {}}
  params["layers"] = {k: np.empty(s, np_dtype) for k, s in shapes["layers"].items()}
  seen: set[str] = set()
  for file in _weight_files(path):
    for name, arr in iter_safetensors(file):
      _place(params, shapes, config, name, arr, np_dtype, seen)
  check_complete(path, config, seen, "checkpoint")
  return config, params


def check_complete(path: str, config: Qwen2Config, seen: set, kind: str) -> None:
  """Raise CheckpointError naming the params (`name` or `name.layer`) a load did not fill."""
  shapes = param_shapes(config)
  expected = {"embed", "final_norm"} | {
    f"{k}.{i}" for k in shapes["layers"] for i in range(config.num_layers)
  }
  if not config.tie_word_embeddings:
    expected.add("lm_head")
  missing = sorted(expected - seen)
  if missing:
    raise CheckpointError(
      f"{path}: {kind} lacks tensors for {missing[:8]}{' ...' if len(missing) > 8 else ''}"
    )


def _place(params, shapes, config, name, arr, np_dtype, seen):
  m = _LAYER_RE.match(name)
  if m:
    layer, rest = int(m.group(1)), m.group(2)
    if rest not in _LAYER_MAP:
      raise CheckpointError(f"unexpected tensor {name} (not part of {config.architecture})")
    ours, transpose = _LAYER_MAP[rest]
    if ours not in shapes["layers"]:
      raise CheckpointError(
        f"unexpected tensor {name}: config.json says attention_bias="
        f"{config.attention_bias} ({config.architecture})"
      )
    if layer >= config.num_layers:
      raise CheckpointError(
        f"tensor {name}: layer {layer} >= num_hidden_layers {config.num_layers}"
      )
    value = arr.T if transpose else arr
    want = shapes["layers"][ours][1:]
    if tuple(value.shape) != tuple(want):
      raise CheckpointError(
        f"tensor {name}: shape {tuple(arr.shape)} does not fit {ours} "
        f"{tuple(want)} (after transpose={transpose})"
      )
    params["layers"][ours][layer] = value.astype(np_dtype)
    seen.add(f"{ours}.{layer}")
    return
  if name not in _TOP_MAP:
    if name.endswith("rotary_emb.inv_freq"):
      return
    raise CheckpointError(f"unexpected tensor {name} (not part of {config.architecture})")
  ours, transpose = _TOP_MAP[name]
  if ours == "lm_head" and config.tie_word_embeddings:
    return  # some exports store the tied head as well; the embedding is authoritative
  value = arr.T if transpose else arr
  if tuple(value.shape) != tuple(shapes[ours]):
    raise CheckpointError(
      f"tensor {name}: shape {tuple(arr.shape)} does not fit {ours} "
      f"{tuple(shapes[ours])} (after transpose={transpose})"
    )
  params[ours] = np.array(value, dtype=np_dtype)
  seen.add(ours)


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------


def _hf_tensors(config: Qwen2Config, params) -> Iterator[tuple[str, np.ndarray]]:
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
  path: str, config: Qwen2Config, params, *, max_shard_bytes: int = 4 << 30
) -> None:
  """Write config.json + safetensors (sharded with an index past `max_shard_bytes`)."""
  from etils import epath

  remote = "://" in str(path)
  local = tempfile.mkdtemp(prefix="empo2_hf_out_") if remote else str(path)
  os.makedirs(local, exist_ok=True)
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
  if remote:
    dst = epath.Path(path)
    dst.mkdir(parents=True, exist_ok=True)
    for fname in os.listdir(local):
      (dst / fname).write_bytes((epath.Path(local) / fname).read_bytes())
