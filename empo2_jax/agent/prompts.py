"""The agent's own chat text (docs/method.md §2): the outcome message of the tip chat. An
environment's messages are its `PromptSet` (envs/base.py; ScienceWorld's in
envs/scienceworld/prompts.py), whose tips are written with empo2_jax/tips.tip_block, so the memory
and the tip-free batch views (tips.strip_tips) work for every environment unchanged.
"""

from __future__ import annotations

from typing import Optional


def outcome_message(final_observation: str, score: float, out_of: Optional[float] = 100) -> str:
  """What the tip chat shows before the tip prompt: the last observation and the final score
  ("score 40/100"; without a maximum, "score 0.8")."""
  from empo2_jax.memory.reflect import format_score

  of = f"/{format_score(out_of)}" if out_of else ""
  return (
    f"Observation: {final_observation.strip()}\n\nThe episode is over; your final "
    f"score is {format_score(score)}{of}.\n\n"
  )


__all__ = ["outcome_message"]
