"""SentencePiece `tokenizer.model` files -> a `tokenizers` fast tokenizer with the same ids.

For checkpoint directories that ship only tokenizer.model (Llama 1/2, Mistral style). The fast
tokenizer reproduces SentencePiece's BPE encoding: text is normalized by replacing " " with "▁"
(and prepending one "▁" when the model adds a dummy prefix); merges are ranked by the score of the
piece they produce, which is the order SentencePiece merges in; characters outside the vocabulary
fall back to <0xXX> byte pieces (or <unk>). Decoding inverts all of that.

Supported: model_type BPE with the identity normalizer and remove_extra_whitespaces off (what
Llama/Mistral ship). Anything else raises an error naming the field; such a directory needs a
tokenizer.json.
"""

from __future__ import annotations

import json
import os
from typing import Optional

# sentencepiece ModelProto enums
_BPE = 2
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


def read_model(path: str):
  """The parsed ModelProto of a tokenizer.model file."""
  from sentencepiece import sentencepiece_model_pb2

  proto = sentencepiece_model_pb2.ModelProto()
  with open(path, "rb") as f:
    proto.ParseFromString(f.read())
  return proto


def _check_supported(proto, path: str) -> None:
  t, n = proto.trainer_spec, proto.normalizer_spec
  problems = []
  if t.model_type != _BPE:
    problems.append(f"trainer_spec.model_type={t.model_type} (only BPE=2)")
  if n.name not in ("identity", "") or len(n.precompiled_charsmap):
    problems.append(f"normalizer_spec.name={n.name!r} (only identity)")
  if n.remove_extra_whitespaces:
    problems.append("normalizer_spec.remove_extra_whitespaces=true")
  if t.treat_whitespace_as_suffix:
    problems.append("trainer_spec.treat_whitespace_as_suffix=true")
  if problems:
    raise ValueError(
      f"{path}: SentencePiece settings not supported without a tokenizer.json: "
      f"{'; '.join(problems)}. Add a tokenizer.json (e.g. saved by transformers) "
      "to the directory"
    )


def merges_from_scores(pieces: dict[str, float]) -> list[tuple[str, str]]:
  """BPE merges implied by scored pieces: every split (left, right) of a piece into two pieces,
  best-scored result first (SentencePiece merges the pair whose result scores highest), ties
  broken by the parts' scores."""
  found = []
  for piece, score in pieces.items():
    for i in range(1, len(piece)):
      left, right = piece[:i], piece[i:]
      if left in pieces and right in pieces:
        found.append((-score, -pieces[left], -pieces[right], left, right))
  found.sort()
  return [(left, right) for *_, left, right in found]


def tokenizer_json(proto) -> dict:
  """tokenizer.json (the `tokenizers` format) equivalent to a SentencePiece BPE model."""
  t, n = proto.trainer_spec, proto.normalizer_spec
  vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
  mergeable = {p.piece: p.score for p in proto.pieces if p.type == _NORMAL}
  added = [
    {
      "id": i,
      "content": p.piece,
      "single_word": False,
      "lstrip": False,
      "rstrip": False,
      "normalized": False,
      "special": p.type != _USER_DEFINED,
    }
    for i, p in enumerate(proto.pieces)
    if p.type in (_UNKNOWN, _CONTROL, _USER_DEFINED)
  ]
  replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
  normalizer = (
    {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]}
    if n.add_dummy_prefix
    else replace
  )
  decoders = [
    {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
  ]
  if n.add_dummy_prefix:
    decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
  unk = proto.pieces[t.unk_id].piece if 0 <= t.unk_id < len(proto.pieces) else None
  return {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": normalizer,
    "pre_tokenizer": None,
    "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": decoders},
    "model": {
      "type": "BPE",
      "dropout": None,
      "unk_token": unk,
      "continuing_subword_prefix": None,
      "end_of_word_suffix": None,
      "fuse_unk": True,
      "byte_fallback": bool(t.byte_fallback),
      "ignore_merges": False,
      "vocab": vocab,
      "merges": [list(m) for m in merges_from_scores(mergeable)],
    },
  }


def load_spm_tokenizer(directory: str, model_file: str = "tokenizer.model"):
  """A transformers PreTrainedTokenizerFast for `directory/tokenizer.model`.

  tokenizer_config.json, when present, supplies the special tokens, add_bos_token/add_eos_token
  and the chat template (chat_template.jinja is read as well); otherwise bos/eos/unk/pad come
  from the model's trainer spec and no BOS is added.
  """
  from tokenizers import Tokenizer, processors
  from transformers import PreTrainedTokenizerFast

  path = os.path.join(directory, model_file)
  proto = read_model(path)
  _check_supported(proto, path)
  backend = Tokenizer.from_str(json.dumps(tokenizer_json(proto)))
  t = proto.trainer_spec

  def piece(i: int) -> Optional[str]:
    return proto.pieces[i].piece if 0 <= i < len(proto.pieces) else None

  cfg = {}
  cfg_path = os.path.join(directory, "tokenizer_config.json")
  if os.path.exists(cfg_path):
    with open(cfg_path, encoding="utf-8") as f:
      cfg = json.load(f)

  def token(name, default):
    return _content(cfg.get(name, default))

  kw = dict(
    bos_token=token("bos_token", piece(t.bos_id)),
    eos_token=token("eos_token", piece(t.eos_id)),
    unk_token=token("unk_token", piece(t.unk_id)),
    pad_token=token("pad_token", piece(t.pad_id)),
  )
  prefix = [kw["bos_token"]] if cfg.get("add_bos_token", False) and kw["bos_token"] else []
  suffix = [kw["eos_token"]] if cfg.get("add_eos_token", False) and kw["eos_token"] else []
  if prefix or suffix:
    single = " ".join(prefix + ["$A"] + suffix)
    backend.post_processor = processors.TemplateProcessing(
      single=single,
      pair=" ".join(prefix + ["$A"] + suffix + prefix + ["$B"] + suffix),
      special_tokens=[(s, backend.token_to_id(s)) for s in sorted(set(prefix + suffix))],
    )
  tok = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **kw)
  template = cfg.get("chat_template")
  jinja = os.path.join(directory, "chat_template.jinja")
  if template is None and os.path.exists(jinja):
    with open(jinja, encoding="utf-8") as f:
      template = f.read()
  tok.chat_template = template
  return tok


def _content(token) -> Optional[str]:
  """A special-token entry of tokenizer_config.json (a string or an AddedToken dict) as text."""
  if isinstance(token, dict):
    return token.get("content")
  return token
