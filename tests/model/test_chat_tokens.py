"""Incremental chat tokenisation (model/chat.ChatTokens) equals tokenising the whole chat, step by
step through growing episodes, for the Qwen2.5 and SmolLM2 tokenizers."""

import numpy as np
import pytest

from empo2_jax.model import gguf
from empo2_jax.model.chat import ChatTokens, chat_ids
from empo2_jax.model.tokenizer import load_tokenizer

PIECES = [
  "You are in the kitchen. In it, you see: a fridge, a stove, a cup containing water.",
  "open door to hallway",
  "  leading  and trailing spaces  ",
  "\n\nblank lines\n\n",
  "unicode: 日本語 émigré naïve café 🙂 ¿qué?",
  "<tip>Heat the water first.</tip>",
  "Score: 42/100",
  "",
  "tabs\tand\rcarriage returns",
  "a" * 300,
  "focus on red wax<|im_end|> literal special text in content",
]


def _episodes(rng, n_eps=6, steps=8):
  for _ in range(n_eps):
    msgs = [{"role": "system", "content": "You are an agent. " + PIECES[rng.integers(len(PIECES))]}]
    chats = []
    for _ in range(steps):
      user = " ".join(PIECES[j] for j in rng.integers(len(PIECES), size=rng.integers(1, 4)))
      msgs = msgs + [{"role": "user", "content": user}]
      chats.append(list(msgs))
      answer = PIECES[rng.integers(len(PIECES))]
      msgs = msgs + [{"role": "assistant", "content": answer}]
    yield chats


@pytest.fixture(scope="module", params=["qwen", "smollm2"])
def tok(request):
  return load_tokenizer() if request.param == "qwen" else load_tokenizer(gguf.smollm2_gguf_path())


def test_incremental_equals_whole_chat(tok):
  rng = np.random.default_rng(0)
  saved = 0
  for chats in _episodes(rng):
    inc = ChatTokens(tok)
    for msgs in chats:
      assert inc.tokens(msgs) == chat_ids(tok, msgs)
    # the tip request: the episode's chat plus one more user message, no generation prompt
    tip_chat = chats[-1] + [{"role": "user", "content": "Reflect on the episode."}]
    assert inc.tokens(tip_chat, add_generation_prompt=False) == chat_ids(tok, tip_chat, False)
    saved += inc.stats["chars_full"] - inc.stats["chars"]
    assert inc.stats["chars"] < inc.stats["chars_full"]
  assert saved > 0


def test_unrelated_chat_falls_back_to_whole_tokenisation(tok):
  inc = ChatTokens(tok)
  a = [{"role": "user", "content": "first chat"}]
  b = [{"role": "user", "content": "a different chat altogether"}]
  assert inc.tokens(a) == chat_ids(tok, a)
  assert inc.tokens(b) == chat_ids(tok, b)
  assert inc.tokens(a) == chat_ids(tok, a)
