"""The bundled Qwen2.5 tokenizer: known ids, special tokens, ChatML, round trips."""

import pytest

from empo2_jax.model import tokenizer as tk


@pytest.fixture(scope="module")
def tok():
  return tk.load_tokenizer()


def test_known_ids(tok):
  assert tok("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]
  assert tok("你好")["input_ids"] == [108386]


def test_special_ids(tok):
  ids = tok.convert_tokens_to_ids(tk.SPECIAL_TOKENS)
  assert ids == list(range(151643, 151665))
  assert tk.stop_ids(tok) == (151643, 151645)
  assert tok("<|im_start|>user")["input_ids"][0] == 151644


def test_chatml(tok):
  msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
  text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  assert (
    text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\n"
  )
  ids = tok(text)["input_ids"]
  assert ids[0] == 151644 and ids.count(151645) == 2 and ids[-3] == 151644


@pytest.mark.parametrize(
  "text",
  [
    "The quick brown fox jumps over the lazy dog.",
    "机器学习是人工智能的一个分支。",
    "emoji 🎉🚀 and accents: café naïve",
    "def f(x):\n    return {'a': x ** 2}\n",
    "   lots   of\t\twhitespace\n\n\n  ",
    "mixed 中文 english 123456789 !!!",
  ],
)
def test_round_trip(tok, text):
  ids = tok(text)["input_ids"]
  assert tok.decode(ids) == text
  assert all(i < 151643 for i in ids)


def test_merges_are_consistent():
  ranks = {b"a": 0, b"b": 1, b"ab": 2, b"abb": 3, b"bb": 4}
  merges = tk.bpe_merges(ranks)
  assert merges[0] == (b"a", b"b")
  assert (b"ab", b"b") in merges and (b"b", b"b") not in merges[:1]
