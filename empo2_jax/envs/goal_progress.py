"""ScienceWorld's goal-progress report (`getGoalProgressStr()`) as data: which subgoals of the task
the episode has met. HeRL's hindsight guidance (explore/herl.py) and the rule reflector
(memory/rule_tip.py) both read it."""

from __future__ import annotations

import re

# one subgoal a line: "<index> <true|false> <kind> <description>"
_GOAL_LINE = re.compile(r"^\s*\d+\s+(true|false)\s+\S+\s+(.*\S)\s*$")


def parse_goal_progress(text: str) -> list[tuple[str, bool]]:
  """`getGoalProgressStr()` -> [(description, completed)], sequential subgoals first, then the
  unordered/optional ones, in the simulator's order."""
  out = []
  for line in text.splitlines():
    m = _GOAL_LINE.match(line)
    if m:
      out.append((m.group(2), m.group(1) == "true"))
  return out
