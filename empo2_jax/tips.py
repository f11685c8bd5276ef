"""Tips, in one place (docs/method.md §2, §4): how a tip the policy wrote is cleaned before it is
stored, how memory tips are written into a user message, and how every tip block is removed again
for the tip-free views. The reflection's answer goes through `clean_tip`; the prompts of every
environment write tips with `tip_block`; the batch's "notips" view, the tip-free memory keys and
the paper-era tip chat strip them with `strip_tips`; the release tip chat keeps a block's text and
drops only its tags (`drop_tip_tags`).

    clean_tip("**Tip:** open the door first\nmore")  # "open the door first"
    tip_block(["open the door first"])  # "<tip> Here are some memories ...:\n...\n</tip>\n"
    strip_tips(message)  # every "<tip>...</tip>" block and its trailing newline gone

A stored tip never holds a tag (`clean_tip` removes them), so a block always ends at its own
`</tip>`.
"""

from __future__ import annotations

import re
from typing import Sequence

from empo2_jax.text import printable_text

TIP_OPEN = "<tip> Here are some memories you collected in your previous exploration:"
TIP_CLOSE = "</tip>"
# A tip block and the single newline after it (tip_block ends blocks with "\n").
TIP_BLOCK_RE = re.compile(r"<tip>.*?</tip>\n?", re.DOTALL)
_TIP_TAG = re.compile(r"<tip> ?|</tip>")
MAX_TIP_WORDS = 99  # "< 100 words"

_MARKUP = re.compile(r"<\|[^|>]*\|>|</?tip>")  # <|im_start|>, <|im_end|>, <|endoftext|>, ...
_ROLE_AFTER_START = re.compile(r"<\|im_start\|>\s*(system|user|assistant)\b", re.I)
_LABEL = re.compile(r"^\s*(?:\*\*)?(?:tip|summary|reflection)(?:\*\*)?\s*[:\-]\s*", re.I)


def clean_tip(raw: str, max_words: int = MAX_TIP_WORDS) -> str:
  """One line, no chat markup or tip tags, at most `max_words` words; "" when nothing usable is
  left.

  Tip tags are removed so a stored tip can never close a tip block early (strip_tips).
  """
  # Printable text first, line by line (control characters include the line breaks): a stored
  # tip must encode as UTF-8 (checkpoints), and an invisible character inside a tag ("<ti\u200bp>")
  # must not turn into a tag after the markup is gone.
  text = "\n".join(printable_text(ln) for ln in str(raw).splitlines())
  text = _ROLE_AFTER_START.sub(" ", text)
  text = _MARKUP.sub(" ", text)
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  if not lines:
    return ""
  line = _LABEL.sub("", lines[0]).strip().strip('"').strip()
  words = line.split()
  return " ".join(words[:max_words])


def tip_block(tips: Sequence[str]) -> str:
  """The tip block of a memory step (ends with a newline, as strip_tips expects); "" for none."""
  if not tips:
    return ""
  return TIP_OPEN + "\n" + "\n".join(t.replace("\n", " ") for t in tips) + "\n" + TIP_CLOSE + "\n"


def strip_tips(text: str) -> str:
  return TIP_BLOCK_RE.sub("", text)


def strip_tips_messages(messages):
  return [dict(m, content=strip_tips(m["content"])) for m in messages]


def drop_tip_tags(text: str) -> str:
  """The text with its tip tags removed and the tips' text kept (the release code's tip chat)."""
  return _TIP_TAG.sub("", text)


__all__ = [
  "MAX_TIP_WORDS",
  "TIP_OPEN",
  "TIP_CLOSE",
  "TIP_BLOCK_RE",
  "clean_tip",
  "drop_tip_tags",
  "tip_block",
  "strip_tips",
  "strip_tips_messages",
]
