"""Chat -> token ids, the one way the actor, the update batch and SFT all tokenise a chat.

`chat_ids` renders the chat template to text, then encodes the text without adding special tokens
(the template writes them). `ChatTokens` gives the same ids for a chat that only grows (an
episode: every step appends messages), tokenising only the new text: the previous rendering is
kept up to its last added token (`<|im_start|>`, `<|im_end|>`, ...), and text on either side of
an added token is tokenised independently (tokenizers split added tokens out before they
normalise and pre-tokenise), so ids(prefix through an added token + tail) = ids(prefix) +
ids(tail). When the new rendering does not extend the kept prefix (a different chat, or a template
that rewrites earlier text) it falls back to tokenising the whole chat.
"""

from __future__ import annotations

from typing import Sequence


def chat_text(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
  return tokenizer.apply_chat_template(
    list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
  )


def chat_ids(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
  """Token ids of a chat: the template's text, encoded without added special tokens."""
  text = chat_text(tokenizer, messages, add_generation_prompt)
  return tokenizer(text, add_special_tokens=False)["input_ids"]


def _added_ids(tokenizer) -> frozenset:
  """Ids of added tokens that are safe cut points: those that absorb no whitespace next to them."""
  decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
  return frozenset(
    int(i)
    for i, t in decoder.items()
    if not getattr(t, "lstrip", False) and not getattr(t, "rstrip", False)
  )


class ChatTokens:
  """Incremental `chat_ids` for one growing chat (one per episode).

  `tokens(messages)` returns exactly `chat_ids(tokenizer, messages, add_generation_prompt)`;
  `stats` counts characters tokenised (`chars`) against what whole-chat tokenisation would have
  tokenised (`chars_full`).
  """

  def __init__(self, tokenizer):
    self.tok = tokenizer
    self._added = _added_ids(tokenizer)
    self._fast = bool(getattr(tokenizer, "is_fast", False)) and bool(self._added)
    self._prefix_text = ""  # rendering kept: up to and including its last added token
    self._prefix_ids: list[int] = []
    self.stats = {"calls": 0, "chars": 0, "chars_full": 0}

  def tokens(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
    text = chat_text(self.tok, messages, add_generation_prompt)
    self.stats["calls"] += 1
    self.stats["chars_full"] += len(text)
    if not self._fast:  # no offsets or no added tokens to cut at: whole chat, every time
      self.stats["chars"] += len(text)
      return self.tok(text, add_special_tokens=False)["input_ids"]
    if self._prefix_text and text.startswith(self._prefix_text):
      head_text, head_ids = self._prefix_text, self._prefix_ids
    else:
      head_text, head_ids = "", []
    tail = text[len(head_text) :]
    enc = self.tok(tail, add_special_tokens=False, return_offsets_mapping=True)
    self.stats["chars"] += len(tail)
    ids = head_ids + list(enc["input_ids"])
    # Keep the new rendering up to its last added token for the next call.
    for k in range(len(enc["input_ids"]) - 1, -1, -1):
      if enc["input_ids"][k] in self._added:
        end = enc["offset_mapping"][k][1]
        self._prefix_text = head_text + tail[:end]
        self._prefix_ids = head_ids + list(enc["input_ids"][: k + 1])
        break
    return ids


__all__ = ["chat_text", "chat_ids", "ChatTokens"]
