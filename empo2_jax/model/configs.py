"""Qwen2 / Qwen2.5 architecture settings and the published model presets.

A `Qwen2Config` holds the shapes of the network plus two numeric settings that are ours, not the
checkpoint's: `param_dtype` (how weights are stored) and `compute_dtype` (what matmuls run in).
Normalisation statistics, RoPE and the softmax always run in float32.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

REMAT_POLICIES = ("none", "full", "dots_saveable")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 32768
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: str = "none"          # none | full | dots_saveable (decoder layers)
  scan_layers: bool = True     # stack layers and run them with lax.scan

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    for f in ("param_dtype", "compute_dtype"):
      if getattr(self, f) not in DTYPES:
        raise ValueError(f"{f}={getattr(self, f)!r}; valid: {sorted(DTYPES)}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat={self.remat!r}; valid: {REMAT_POLICIES}")

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  @property
  def jnp_compute_dtype(self):
    return DTYPES[self.compute_dtype]

  def replace(self, **kw: Any) -> "Qwen2Config":
    valid = {f.name for f in dataclasses.fields(self)}
    bad = sorted(set(kw) - valid)
    if bad:
      raise KeyError(f"unknown Qwen2Config fields {bad}; valid: {sorted(valid)}")
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    d, f, v, hd = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
    q, kv = self.num_heads * hd, self.num_kv_heads * hd
    layer = d * q + q + 2 * (d * kv + kv) + q * d + 3 * d * f + 2 * d
    return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + d

  # Hugging Face config.json <-> ours.
  def to_hf_dict(self) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim, "rope_theta": self.rope_theta,
        "rms_norm_eps": self.rms_norm_eps, "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
        "attention_dropout": 0.0, "use_sliding_window": False, "rope_scaling": None,
        "bos_token_id": 151643, "eos_token_id": 151645,
        "torch_dtype": "bfloat16" if self.param_dtype == "bfloat16" else "float32",
    }

  @classmethod
  def from_hf_dict(cls, hf: dict, **overrides: Any) -> "Qwen2Config":
    arch = hf.get("architectures") or []
    if hf.get("model_type") != "qwen2" and "Qwen2ForCausalLM" not in arch:
      raise ValueError(f"not a Qwen2 checkpoint: model_type={hf.get('model_type')!r}, "
                       f"architectures={arch}; empo2_jax loads Qwen2/Qwen2.5 (Qwen2ForCausalLM)")
    if hf.get("hidden_act", "silu") != "silu":
      raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported (only silu)")
    rope_scaling = hf.get("rope_scaling")
    rope_params = hf.get("rope_parameters") or {}
    if rope_scaling or rope_params.get("rope_type", "default") not in ("default", None):
      raise ValueError(f"rope scaling {rope_scaling or rope_params} is not supported; "
                       "use a checkpoint without rope_scaling (plain RoPE)")
    if hf.get("use_sliding_window", False):
      raise ValueError("use_sliding_window=True is not supported")
    theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    heads = hf["num_attention_heads"]
    kw = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=float(theta),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 32768))
    kw.update(overrides)
    return cls(**kw)


def _qwen25(d, f, layers, heads, kv, tie, vocab=151936):
  return Qwen2Config(vocab_size=vocab, hidden_size=d, intermediate_size=f, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv, head_dim=d // heads,
                     tie_word_embeddings=tie)


# Shapes as published in the Qwen2.5 model cards / config.json files.
PRESETS = {
    "0.5b": lambda: _qwen25(896, 4864, 24, 14, 2, True),
    "1.5b": lambda: _qwen25(1536, 8960, 28, 12, 2, True),
    "3b": lambda: _qwen25(2048, 11008, 36, 16, 2, True),
    "7b": lambda: _qwen25(3584, 18944, 28, 28, 4, False, vocab=152064),
    "14b": lambda: _qwen25(5120, 13824, 48, 40, 8, False, vocab=152064),
    "32b": lambda: _qwen25(5120, 27648, 64, 40, 8, False, vocab=152064),
    "72b": lambda: _qwen25(8192, 29568, 80, 64, 8, False, vocab=152064),
    # Test/CPU model: Qwen2 architecture with the real vocabulary, tiny everywhere else.
    "tiny": lambda: Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128,
                                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                tie_word_embeddings=True),
}


def get_preset(name: str, **overrides: Any) -> Qwen2Config:
  key = name.lower().replace("qwen2.5-", "")
  if key not in PRESETS:
    raise KeyError(f"unknown model preset {name!r}; valid: {sorted(PRESETS)}")
  cfg = PRESETS[key]()
  return cfg.replace(**overrides) if overrides else cfg
