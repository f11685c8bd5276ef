"""The rule-based reflector (`empo2.reflector="rule"`): a MECHANISM CHECK, not a method.

EMPO2's tips are written by the policy itself (memory/reflect.py). A small policy writes fluent but
useless tips, so a null result could mean "memory does not help" or "the tips say nothing". The
rule reflector separates the two: it writes a one-line tip from what the episode itself showed,
with no model and no gold path:

  - the actions after which the score went up, and by how much (the per-step score deltas the
    env reported: StepResult.reward, an episode's Turn.reward), in the order they were taken;
  - the subgoals ScienceWorld reports as not met at the episode's end (its goal-progress text,
    `getGoalProgressStr`, fetched by the env on the last step: StepInfo.goals, Episode.goals).

    rule_tip(["open door", "focus on cat"], [0, 50], goal_text)
    -> "Actions that raised the score: focus on cat (+50). Unmet subgoals: move living thing to
        answer box. Unmet optional subgoals: Pick up object."

Everything here is pure (text in, text out). The tip goes through the same clean-up and memory
write as a policy tip (agent/actor.py), so memory, modes and the off-policy update are unchanged.
"""

from __future__ import annotations

from typing import Sequence

from empo2_jax.text import parse_goal_progress
from empo2_jax.memory.reflect import format_score

REFLECTORS = ("policy", "rule")  # empo2.reflector: the policy writes its tip, or rule_tip does
MAX_TIP_CHARS = 480  # the tip's length cap (characters); items past it are dropped whole
_OPTIONAL_HEADER = "Unordered and Optional Subgoals"  # the goal-progress text's second section


def check_reflector(name: str) -> str:
  """`name` if it is a valid empo2.reflector, else ValueError naming the valid ones."""
  if name not in REFLECTORS:
    raise ValueError(
      f"empo2.reflector={name!r}; valid: policy (the policy writes its own tip), rule (a tip "
      "built from the episode's score gains and unmet subgoals: a mechanism check)"
    )
  return name


def score_gains(actions: Sequence[str], deltas: Sequence[float]) -> list[tuple[str, float]]:
  """(action, gain) for every step whose score delta is positive, in step order."""
  if len(actions) != len(deltas):
    raise ValueError(f"{len(actions)} actions but {len(deltas)} score deltas; pass one per step")
  return [(str(a).strip(), float(d)) for a, d in zip(actions, deltas) if float(d) > 0]


def unmet_subgoals(goal_progress: str) -> tuple[list[str], list[str]]:
  """(sequential, optional) subgoal descriptions marked not completed in ScienceWorld's
  goal-progress text, each in the simulator's order without repeats; ([], []) for ""."""
  head, sep, tail = (goal_progress or "").partition(_OPTIONAL_HEADER)

  def unmet(text):
    out = []
    for desc, done in parse_goal_progress(text):
      if not done and desc not in out:
        out.append(desc)
    return out

  return unmet(head), unmet(tail) if sep else []


def rule_tip(
  actions: Sequence[str],
  deltas: Sequence[float],
  goal_progress: str,
  max_chars: int = MAX_TIP_CHARS,
) -> str:
  """The one-line tip of an episode: its score-raising actions with their gains, then its unmet
  (sequential, then optional) subgoals. At most `max_chars` characters: listed items that do not
  fit are dropped whole, and "..." marks a cut list."""
  if max_chars < 40:
    raise ValueError(f"max_chars={max_chars}; a tip needs at least 40 characters")
  gains = [f"{a} (+{format_score(g)})" for a, g in score_gains(actions, deltas)]
  sequential, optional = unmet_subgoals(goal_progress)
  sections = [("Actions that raised the score: ", gains)] if gains else []
  if not gains:
    sections.append(("No action raised the score.", []))
  if sequential:
    sections.append(("Unmet subgoals: ", sequential))
  if optional:
    sections.append(("Unmet optional subgoals: ", optional))
  parts: list[str] = []
  used = 0
  for label, items in sections:
    text = label if not items else _fit(label, items, max_chars - used - len(parts))
    if text is None:
      break
    parts.append(text)
    used += len(text)
  return " ".join(parts)


def _fit(label: str, items: Sequence[str], budget: int) -> str | None:
  """`label` + as many `items` ("; "-joined, "." after) as fit `budget` characters; None if not
  even the first one does."""
  text, shown = label, 0
  for item in items:
    cand = text + ("; " if shown else "") + item
    more = shown + 1 < len(items)
    if len(cand) + (4 if more else 1) > budget:
      break
    text, shown = cand, shown + 1
  if not shown:
    return None
  return text + ("; ..." if shown < len(items) else ".")


def episode_rule_tip(episode, max_chars: int = MAX_TIP_CHARS) -> str:
  """rule_tip of an agent.episode.Episode: its executed actions, its turns' score deltas (the
  env's rewards, not the intrinsic ones) and its goal progress at the end."""
  return rule_tip(
    episode.executed[: len(episode.turns)],
    [t.reward for t in episode.turns],
    episode.goals,
    max_chars,
  )


__all__ = [
  "REFLECTORS",
  "MAX_TIP_CHARS",
  "check_reflector",
  "score_gains",
  "unmet_subgoals",
  "rule_tip",
  "episode_rule_tip",
]
