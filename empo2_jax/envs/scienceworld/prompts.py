"""ScienceWorld's messages (docs/method.md §2), in our own words: the first user message and the
one after each action, as the `PromptSet` of ScienceWorld's registry entry (suite.py).

An episode's chat only grows: turn t's prompt is turn t-1's prompt + the model's raw response + the
next user message, so the sampler can reuse the cached prefix. For that reason the action
instruction closes EVERY user message (not only the last one) and a turn's tip block stays in that
turn's user message for the rest of the episode (docs/fidelity.md, "Tips in the prompt").

  first user message: task, few-shot gold trajectories, action templates, focus items, inventory,
                      current observation, [tip block], instruction
  later user message: observation, [tip block], instruction
"""

from __future__ import annotations

from typing import Sequence

from empo2_jax.envs.base import PromptSet
from empo2_jax.envs.fewshot import PromptMaterial, format_trajectory
from empo2_jax.tips import tip_block

INSTRUCTION = (
  "Reply with exactly one action on a single line, written like the templates above, "
  "with no explanation. If you are not sure what to do, try something new."
)


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


SCIENCEWORLD = PromptSet(first_user_message, step_user_message, 100)

__all__ = ["INSTRUCTION", "first_user_message", "step_user_message", "SCIENCEWORLD"]
