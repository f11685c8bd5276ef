"""Markdown structure for the docs tests: fenced code blocks (CommonMark's rules for backtick and
tilde fences) and headings outside them."""

from __future__ import annotations

import dataclasses
import re

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclasses.dataclass
class Block:
  lang: str  # the info string's first word ("" for none)
  start: int  # 1-based line of the opening fence
  lines: list[str]  # the lines between the fences
  closed: bool


def parse(text: str) -> tuple[list[Block], list[tuple[int, str]]]:
  """(fenced blocks, prose lines as (1-based line, text)): a block runs from an opening fence to
  the first line that is a fence of the same character, at least as long, with nothing after it;
  one left open runs to the end of the page (closed=False)."""
  blocks, prose, open_block, marker = [], [], None, ""
  for n, line in enumerate(text.splitlines(), 1):
    m = FENCE.match(line)
    if open_block is None:
      if m and not (m.group(2)[0] == "`" and "`" in m.group(3)):
        marker = m.group(2)
        open_block = Block(m.group(3).strip().split(" ")[0], n, [], False)
      else:
        prose.append((n, line))
    elif (
      m and m.group(2)[0] == marker[0] and len(m.group(2)) >= len(marker) and not m.group(3).strip()
    ):
      open_block.closed = True
      blocks.append(open_block)
      open_block = None
    else:
      open_block.lines.append(line)
  if open_block is not None:
    blocks.append(open_block)
  return blocks, prose


def headings(prose: list[tuple[int, str]]) -> list[tuple[int, int, str]]:
  """(line, level, title) of the ATX headings among the prose lines."""
  out = []
  for n, line in prose:
    m = HEADING.match(line)
    if m:
      out.append((n, len(m.group(1)), m.group(2)))
  return out
