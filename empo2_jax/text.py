"""Text helpers every layer may use (no imports from the package): text that can reach a JVM
bridge or a checkpoint (`printable_text`), and ScienceWorld's goal-progress report as data
(`parse_goal_progress`: `getGoalProgressStr()`, which HeRL's hindsight guidance, methods/herl.py,
and the rule reflector, memory/rule_tip.py, read)."""

from __future__ import annotations

import re
import unicodedata

# one subgoal a line: "<index> <true|false> <kind> <description>"
_GOAL_LINE = re.compile(r"^\s*\d+\s+(true|false)\s+\S+\s+(.*\S)\s*$")


def printable_text(text: str) -> str:
  """`text` without what cannot or should not reach the simulator: control characters (NUL, ESC,
  ...) become spaces; format characters (zero-width joiners, bidi marks), lone surrogates (which
  the JVM bridge cannot encode: the call fails and the worker dies), private-use and unassigned
  code points are dropped. Everything else, whitespace included, is kept."""
  text = str(text)
  if text.isprintable():  # no control, format, surrogate, private or unassigned code point
    return text
  return "".join(
    " " if cat == "Cc" else ch
    for ch, cat in ((ch, unicodedata.category(ch)) for ch in text)
    if cat == "Cc" or cat[0] != "C"
  )


def parse_goal_progress(text: str) -> list[tuple[str, bool]]:
  """`getGoalProgressStr()` -> [(description, completed)], sequential subgoals first, then the
  unordered/optional ones, in the simulator's order."""
  out = []
  for line in text.splitlines():
    m = _GOAL_LINE.match(line)
    if m:
      out.append((m.group(2), m.group(1) == "true"))
  return out


__all__ = ["printable_text", "parse_goal_progress"]
