"""Llama-family decoder settings (Qwen2 = Llama + q/k/v biases) and the published model presets.

A `LlamaConfig` (the name is historical: it covers Llama, SmolLM2 and Qwen2/Qwen2.5) holds the
shapes of the network plus two numeric settings that are ours, not the checkpoint's: `param_dtype`
(how weights are stored) and `compute_dtype` (what matmuls run in). Normalisation statistics, RoPE
and the softmax always run in float32.

The two architectures differ only in `attention_bias` (Qwen2: biases on the q/k/v projections;
Llama: none, and no bq/bk/bv params in the tree) and in the RoPE frequencies a Llama 3 checkpoint
may rescale (`rope_scaling`). `from_hf_dict` reads `LlamaForCausalLM` and `Qwen2ForCausalLM`
config.json files and fails, naming the field, on anything this model would compute differently.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

from empo2_jax.model import lora

REMAT_POLICIES = ("none", "full", "dots_saveable")
ATTENTION_IMPLS = ("flash", "dense")
DECODE_KERNELS = ("auto", "cpu", "xla")  # LlamaConfig.decode_kernels (model/cpu_kernels.py)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 RoPE frequency scaling (transformers' rope_type "llama3").

  Wavelengths longer than original_max_position_embeddings / low_freq_factor are divided by
  `factor`, those shorter than original_max_position_embeddings / high_freq_factor are kept, and
  the band between is interpolated smoothly.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __post_init__(self):
    if self.factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
      raise ValueError(
        f"rope_scaling {self}: need factor > 0 and high_freq_factor > low_freq_factor"
      )

  def to_hf_dict(self) -> dict:
    return {"rope_type": "llama3", **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
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
  attention_bias: bool = True  # q/k/v projection biases: Qwen2 True, Llama False
  rope_scaling: Optional[RopeScaling] = None
  bos_token_id: Optional[int] = None  # written to config.json only; never used by the forward
  eos_token_id: Optional[int | tuple[int, ...]] = None
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: str = "none"  # none | full | dots_saveable (decoder layers)
  scan_layers: bool = True  # stack layers and run them with lax.scan
  # Cache-free (training / scoring) forward: queries in blocks of this many positions, each
  # attending only to the keys up to its block's end (the causal mask disallows the rest), which
  # skips ~half the score matrix's flops and memory traffic. 0: one block (the full matrix).
  # "flash" also cuts the keys into blocks of this length (bench/attention.py: 512 was faster
  # than 1024 and compiled faster than 256 at 2,048 tokens on XLA:CPU).
  attention_block: int = 512
  # Cache-free attention: "flash" (model/attention.py: `attention_block`-sized query and key
  # tiles, online softmax, a backward that recomputes the tiles; nothing [T, T]-sized is kept for
  # the gradient) or "dense" (each query block's full float32 score rows, kept by autodiff).
  attention_impl: str = "flash"
  # Cached (sampler) forward: keys are read from the cache in blocks of this many slots with an
  # online softmax, and only the blocks below the furthest query's slot are read, so a decode step
  # costs the filled part of the cache, not its allocated length. 512: on XLA:CPU (SmolLM2-135M,
  # 8 rows, ~1.6-2.2k cached tokens) a decode step took 74-85 ms against 79-91 at 256 (fewer,
  # larger block products) and a 150-token prefill 2.9-3.3 s against 3.3-4.4; 2,048 was slower
  # (the last block reads far past the filled slots).
  cache_block: int = 512
  # Cached forward: "auto" runs a decode step's products and cache attention, and a prefill
  # chunk's cache attention (head_dim 64 or 128), in model/cpu_kernels.cc and cpu_attention.cc
  # on the CPU backend in float32 when the kernels build (one pass over the weights and the
  # filled cache, read in place), XLA's otherwise; "cpu" insists on them (an error where they
  # cannot run); "xla" never uses them. Other backends always run XLA.
  decode_kernels: str = "auto"
  # LoRA (model/lora.py): 0 trains every weight; r > 0 freezes them and trains rank-r fp32
  # adapters on lora_targets (peft's module names; a string such as "all-linear" or
  # "q_proj,v_proj" is parsed), their output scaled by lora_alpha / lora_rank.
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = tuple(lora.TARGETS)

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    for f in ("param_dtype", "compute_dtype"):  # config.model's keys of the same names
      if getattr(self, f) not in DTYPES:
        raise ValueError(f"model.{f}={getattr(self, f)!r}; valid: {', '.join(sorted(DTYPES))}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat={self.remat!r}; valid: {REMAT_POLICIES}")
    if self.attention_block < 0:
      raise ValueError(f"attention_block={self.attention_block} must be >= 0 (0: no blocking)")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl={self.attention_impl!r}; valid: {ATTENTION_IMPLS}")
    if self.cache_block < 1:
      raise ValueError(f"cache_block={self.cache_block} must be >= 1")
    if self.decode_kernels not in DECODE_KERNELS:
      raise ValueError(f"decode_kernels={self.decode_kernels!r}; valid: {DECODE_KERNELS}")
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
      raise TypeError(f"rope_scaling={self.rope_scaling!r}; pass a configs.RopeScaling or None")
    if isinstance(self.eos_token_id, list):  # keep the config hashable (a jit static argument)
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    object.__setattr__(self, "lora_targets", lora.parse_targets(self.lora_targets))
    if self.lora_rank < 0 or self.lora_alpha <= 0:
      raise ValueError(
        f"lora_rank={self.lora_rank}, lora_alpha={self.lora_alpha}: need rank >= 0 (0: full "
        "fine-tuning) and alpha > 0"
      )

  @property
  def architecture(self) -> str:
    return "Qwen2ForCausalLM" if self.attention_bias else "LlamaForCausalLM"

  @property
  def lora_scale(self) -> float:
    """The adapters' output scale, alpha / r (peft's `scaling`); 0 without adapters."""
    return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  @property
  def jnp_compute_dtype(self):
    return DTYPES[self.compute_dtype]

  def replace(self, **kw: Any) -> "LlamaConfig":
    valid = {f.name for f in dataclasses.fields(self)}
    bad = sorted(set(kw) - valid)
    if bad:
      raise KeyError(f"unknown LlamaConfig fields {bad}; valid: {sorted(valid)}")
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    d, f, v, hd = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
    q, kv = self.num_heads * hd, self.num_kv_heads * hd
    bias = q + 2 * kv if self.attention_bias else 0
    layer = d * q + 2 * d * kv + bias + q * d + 3 * d * f + 2 * d
    return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + d

  # Hugging Face config.json <-> ours.
  def to_hf_dict(self) -> dict:
    """config.json for transformers' Qwen2ForCausalLM (attention_bias) or LlamaForCausalLM.

    RoPE settings are written the classic way (rope_theta + rope_scaling), which transformers
    4.x and 5.x both read.
    """
    out = {
      "architectures": [self.architecture],
      "model_type": "qwen2" if self.attention_bias else "llama",
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "rope_theta": self.rope_theta,
      "rope_scaling": self.rope_scaling.to_hf_dict() if self.rope_scaling else None,
      "rms_norm_eps": self.rms_norm_eps,
      "tie_word_embeddings": self.tie_word_embeddings,
      "max_position_embeddings": self.max_position_embeddings,
      "hidden_act": "silu",
      "attention_dropout": 0.0,
      "torch_dtype": "bfloat16" if self.param_dtype == "bfloat16" else "float32",
    }
    if self.attention_bias:
      out["use_sliding_window"] = False
    else:
      out.update(attention_bias=False, mlp_bias=False)
    if self.bos_token_id is not None:
      out["bos_token_id"] = self.bos_token_id
    if self.eos_token_id is not None:
      eos = self.eos_token_id
      out["eos_token_id"] = list(eos) if isinstance(eos, tuple) else eos
    return out

  @classmethod
  def from_hf_dict(cls, hf: dict, **overrides: Any) -> "LlamaConfig":
    """Ours from a LlamaForCausalLM / Qwen2ForCausalLM config.json; raises ValueError naming the
    field for any setting this model does not compute (other rope types, mlp_bias, ...)."""
    arch = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if model_type == "qwen2" or "Qwen2ForCausalLM" in arch:
      attention_bias = True  # Qwen2 always has q/k/v biases and no o_proj bias
      if hf.get("use_sliding_window", False):
        raise ValueError("use_sliding_window=True is not supported (full attention only)")
    elif model_type == "llama" or "LlamaForCausalLM" in arch:
      attention_bias = False
      if hf.get("attention_bias", False):
        raise ValueError(
          "attention_bias=True is not supported for Llama (it adds an o_proj "
          "bias this model does not have)"
        )
      if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported (MLP projections have no biases here)")
    else:
      raise ValueError(
        f"unsupported checkpoint: model_type={model_type!r}, architectures={arch}; "
        "empo2_jax loads LlamaForCausalLM (Llama, SmolLM2) and Qwen2ForCausalLM "
        "(Qwen2/Qwen2.5) checkpoints"
      )
    if hf.get("hidden_act", "silu") != "silu":
      raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported (only silu)")
    required = (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
    )
    missing = [k for k in required if k not in hf]
    if missing:
      raise ValueError(f"config.json lacks {missing}")
    rope_params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {}) or {
      k: v for k, v in rope_params.items() if k != "rope_theta"
    }
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in ("default", None):
      rope_scaling = None
    elif rope_type == "llama3":
      try:
        rope_scaling = RopeScaling(
          factor=float(scaling["factor"]),
          low_freq_factor=float(scaling["low_freq_factor"]),
          high_freq_factor=float(scaling["high_freq_factor"]),
          original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
      except KeyError as e:
        raise ValueError(f"rope_scaling {scaling} lacks {e}") from None
    else:
      raise ValueError(
        f"rope scaling type {rope_type!r} ({scaling}) is not supported; "
        "supported: default (plain RoPE) and llama3"
      )
    theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    kw = dict(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      rope_theta=float(theta),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_word_embeddings=hf.get("tie_word_embeddings", False),
      max_position_embeddings=hf.get("max_position_embeddings", 32768),
      attention_bias=attention_bias,
      rope_scaling=rope_scaling,
      bos_token_id=hf.get("bos_token_id"),
      eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
    )
    kw.update(overrides)
    return cls(**kw)


_QWEN_IDS = dict(bos_token_id=151643, eos_token_id=151645)  # <|endoftext|>, <|im_end|>
_SMOLLM_IDS = dict(bos_token_id=1, eos_token_id=2)  # <|im_start|>, <|im_end|>


def _qwen25(d, f, layers, heads, kv, tie, vocab=151936):
  return LlamaConfig(
    vocab_size=vocab,
    hidden_size=d,
    intermediate_size=f,
    num_layers=layers,
    num_heads=heads,
    num_kv_heads=kv,
    head_dim=d // heads,
    tie_word_embeddings=tie,
    **_QWEN_IDS,
  )


def _smollm2(d, f, layers, heads, kv, theta):
  return LlamaConfig(
    vocab_size=49152,
    hidden_size=d,
    intermediate_size=f,
    num_layers=layers,
    num_heads=heads,
    num_kv_heads=kv,
    head_dim=d // heads,
    rope_theta=theta,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    attention_bias=False,
    **_SMOLLM_IDS,
  )


# Shapes as published in the model cards / config.json files (Qwen2.5; SmolLM2, which is Llama).
PRESETS = {
  "0.5b": lambda: _qwen25(896, 4864, 24, 14, 2, True),
  "1.5b": lambda: _qwen25(1536, 8960, 28, 12, 2, True),
  "3b": lambda: _qwen25(2048, 11008, 36, 16, 2, True),
  "7b": lambda: _qwen25(3584, 18944, 28, 28, 4, False, vocab=152064),
  "14b": lambda: _qwen25(5120, 13824, 48, 40, 8, False, vocab=152064),
  "32b": lambda: _qwen25(5120, 27648, 64, 40, 8, False, vocab=152064),
  "72b": lambda: _qwen25(8192, 29568, 80, 64, 8, False, vocab=152064),
  "smollm2-135m": lambda: _smollm2(576, 1536, 30, 9, 3, 100_000.0),
  "smollm2-360m": lambda: _smollm2(960, 2560, 32, 15, 5, 100_000.0),
  "smollm2-1.7b": lambda: _smollm2(2048, 8192, 24, 32, 32, 130_000.0),
  # SmolLM2's vocabulary and architecture at ~0.9M parameters outside the 6.3M embedding: a
  # model trained from scratch in minutes (configs/vault.py:scratch)
  "smollm2-small": lambda: _smollm2(128, 384, 4, 4, 2, 100_000.0),
  # Test/CPU model: Qwen2 architecture with the real vocabulary, tiny everywhere else.
  "tiny": lambda: LlamaConfig(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    **_QWEN_IDS,
  ),
}


def get_preset(name: str, **overrides: Any) -> LlamaConfig:
  key = name.lower().replace("qwen2.5-", "")
  if key not in PRESETS:
    raise KeyError(f"unknown model preset {name!r}; valid: {sorted(PRESETS)}")
  cfg = PRESETS[key]()
  return cfg.replace(**overrides) if overrides else cfg
