"""What the agent sees of WebShop, after verl-agent's wrapper (docs/methods.md §1.8), in our words.

`agent_observation` turns a page of the original text mode into the agent's view: the page's parts
after the instruction, each in single quotes, joined with ' [SEP] ' (verl-agent's `format_obs`;
the instruction is in the task line already), then the admissible actions one per line:
'search[<your query>]' when the page has a search bar, then 'click[x]' for every clickable
(including the start page's no-op 'click[search]', as verl-agent lists it). The page part alone
is verl-agent's GiGPO anchor observation (`anchor_observation`); our Turn.obs_key is the whole
agent view, which groups steps exactly as the anchor does, because the action list is a function
of the page text (its buttons, the asins and option values it shows).

The prompts follow the project's multi-turn chat (envs/scienceworld/prompts.py: the chat grows, a
tip block in the user message of a memory step) rather than verl-agent's single prompt with a
two-step history; the opening names the role and the task as verl-agent's template does. The
closing line asks for one admissible action on its own line; the env's parser also accepts
verl-agent's `<action>...</action>` answers (env.extract_action).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.envs.base import PromptSet
from empo2_jax.tips import tip_block
from empo2_jax.envs.webshop.pages import SEP

SEARCH_ACTION = "search[<your query>]"
CLOSING = (
  "Reply with exactly one admissible action on a single line, such as search[your keywords] or "
  "click[an item from the list], with no explanation."
)


def anchor_observation(observation: str, instruction: str) -> str:
  """verl-agent's formatted observation: the parts after the instruction, quoted."""
  parts = observation.split(SEP)
  if instruction in parts:
    parts = parts[parts.index(instruction) + 1 :]
  return SEP.join(f"'{p}'" for p in parts)


def admissible_actions(has_search_bar: bool, clickables: Sequence[str]) -> list[str]:
  return ([SEARCH_ACTION] if has_search_bar else []) + [f"click[{c}]" for c in clickables]


def agent_observation(
  observation: str, instruction: str, has_search_bar: bool, clickables: Sequence[str]
) -> str:
  actions = admissible_actions(has_search_bar, clickables)
  listing = "\n".join(f"'{a}'," for a in actions)
  return (
    f"{anchor_observation(observation, instruction)}\n"
    f"Your admissible actions of the current situation are:\n[\n{listing}\n]"
  )


@dataclasses.dataclass(frozen=True)
class WebShopMaterial:
  task_description: str  # the goal's instruction text


def first_user_message(material: WebShopMaterial, observation: str, tips: Sequence[str] = ()):
  parts = [
    "You are an expert autonomous agent operating in the WebShop e-commerce environment.",
    f"Your task is to: {material.task_description.strip()}.",
    "Search for products with search[keywords]; click[...] opens a product, picks an option "
    "or presses a button. Choose the options the task asks for, then click[buy now].",
    f"Your current observation is: {observation.strip()}",
  ]
  return "\n\n".join(parts) + "\n\n" + tip_block(tips) + CLOSING


def step_user_message(observation: str, tips: Sequence[str] = ()) -> str:
  return f"Observation: {observation.strip()}\n\n" + tip_block(tips) + CLOSING


# The return is the Table 2 score (100 x the purchase reward) with the default reward_mode.
PROMPTS = PromptSet(first_user_message, step_user_message, score_out_of=100)
