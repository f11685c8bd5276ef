"""The agent's chat (docs/method.md §2), in our own words: the parts every environment shares (the
tip block, the outcome line of the tip chat, `PromptSet`) and ScienceWorld's messages.

An episode's chat only grows: turn t's prompt is turn t-1's prompt + the model's raw response + the
next user message, so the sampler can reuse the cached prefix. For that reason the action
instruction closes EVERY user message (not only the last one) and a turn's tip block stays in that
turn's user message for the rest of the episode.

  first user message: task, few-shot gold trajectories, action templates, focus items, inventory,
                      current observation, [tip block], instruction
  later user message: observation, [tip block], instruction

Another environment brings its own first/step messages in a `PromptSet` (its registry entry,
envs/registry.py) and keeps `tip_block` for its tips, so the memory and the tip-free batch views
(rl.batch.strip_tips) work unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from empo2_jax.envs.fewshot import PromptMaterial, format_trajectory

TIP_OPEN = "<tip> Here are some memories you collected in your previous exploration:"
TIP_CLOSE = "</tip>"

INSTRUCTION = (
  "Reply with exactly one action on a single line, written like the templates above, "
  "with no explanation. If you are not sure what to do, try something new."
)


def tip_block(tips: Sequence[str]) -> str:
  """The tip block of a memory step (ends with a newline, as rl.batch.strip_tips expects)."""
  if not tips:
    return ""
  return TIP_OPEN + "\n" + "\n".join(t.replace("\n", " ") for t in tips) + "\n" + TIP_CLOSE + "\n"


def first_user_message(material: PromptMaterial, observation: str, tips: Sequence[str] = ()) -> str:
  parts = [
    "You are an agent in ScienceWorld, a text-based science laboratory.",
    f"Your task: {material.task_description.strip()}",
  ]
  for i, traj in enumerate(material.few_shot):
    parts.append(
      f"Example {i + 1} (a solved episode of this task, another variation):\n"
      f"{format_trajectory(traj)}"
    )
  parts.append(
    "Actions you can use (replace OBJ/LOC with objects you see):\n"
    + ", ".join(material.action_templates)
  )
  if material.focus_items:
    parts.append("Objects you may focus on: " + ", ".join(material.focus_items))
  parts.append(f"Inventory: {material.inventory.strip()}")
  parts.append(f"Observation: {observation.strip()}")
  return "\n\n".join(parts) + "\n\n" + tip_block(tips) + INSTRUCTION


def step_user_message(observation: str, tips: Sequence[str] = ()) -> str:
  return f"Observation: {observation.strip()}\n\n" + tip_block(tips) + INSTRUCTION


def outcome_message(final_observation: str, score: float, out_of: Optional[float] = 100) -> str:
  """What the tip chat shows before the tip prompt: the last observation and the final score
  ("score 40/100"; without a maximum, "score 0.8")."""
  from empo2_jax.memory.reflect import format_score

  of = f"/{format_score(out_of)}" if out_of else ""
  return (
    f"Observation: {final_observation.strip()}\n\nThe episode is over; your final "
    f"score is {format_score(score)}{of}.\n\n"
  )


@dataclasses.dataclass(frozen=True)
class PromptSet:
  """An environment's messages. first(material, observation, tips) opens the episode (material:
  what the env's registry entry built for (task, variation); it must have `task_description`,
  which the memory keys use); step(observation, tips) follows each action; score_out_of is the
  score's maximum shown in tips and memories ("score 40/100"), None for a return without one."""

  first_user_message: Callable[[Any, str, Sequence[str]], str]
  step_user_message: Callable[[str, Sequence[str]], str]
  score_out_of: Optional[float] = 100


SCIENCEWORLD = PromptSet(first_user_message, step_user_message, 100)
