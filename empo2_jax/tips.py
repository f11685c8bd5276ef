"""The tip block, in one place: how memory tips are written into a user message, and how every tip
block is removed again for the tip-free views (docs/method.md §2, §4). The prompts of every
environment write tips with `tip_block`; the batch's "notips" view, the tip-free memory keys and
the paper-era tip chat strip them with `strip_tips`.

    tip_block(["open the door first"])  # "<tip> Here are some memories ...:\n...\n</tip>\n"
    strip_tips(message)  # every "<tip>...</tip>" block and its trailing newline gone

A stored tip never holds a tag (memory/reflect.clean_tip removes them), so a block always ends at
its own `</tip>`.
"""

from __future__ import annotations

import re
from typing import Sequence

TIP_OPEN = "<tip> Here are some memories you collected in your previous exploration:"
TIP_CLOSE = "</tip>"
# A tip block and the single newline after it (tip_block ends blocks with "\n").
TIP_BLOCK_RE = re.compile(r"<tip>.*?</tip>\n?", re.DOTALL)


def tip_block(tips: Sequence[str]) -> str:
  """The tip block of a memory step (ends with a newline, as strip_tips expects); "" for none."""
  if not tips:
    return ""
  return TIP_OPEN + "\n" + "\n".join(t.replace("\n", " ") for t in tips) + "\n" + TIP_CLOSE + "\n"


def strip_tips(text: str) -> str:
  return TIP_BLOCK_RE.sub("", text)


def strip_tips_messages(messages):
  return [dict(m, content=strip_tips(m["content"])) for m in messages]


__all__ = [
  "TIP_OPEN",
  "TIP_CLOSE",
  "TIP_BLOCK_RE",
  "tip_block",
  "strip_tips",
  "strip_tips_messages",
]
