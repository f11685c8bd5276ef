"""What the prompts need from ScienceWorld: task text, action templates, inventory, focus items,
and gold few-shot trajectories.

Few-shot trajectories replay the library's gold action sequence of a TRAIN variation through our
wrapper, so the observations are exactly what an agent would see. Test variations are never used;
`gold_trajectories` checks the split itself rather than trusting its caller.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the records below serve every env; only the functions need ScienceWorld
  from empo2_jax.envs.scienceworld.env import SciWorldEnv


@dataclasses.dataclass(frozen=True)
class GoldTrajectory:
  task: str
  variation: int  # always a train variation
  task_description: str
  first_observation: str
  steps: tuple[tuple[str, str], ...]  # (action, observation) pairs up to the end of the episode
  final_score: int


@dataclasses.dataclass(frozen=True)
class PromptMaterial:
  task_description: str
  action_templates: tuple[str, ...]
  inventory: str
  focus_items: tuple[str, ...]
  few_shot: tuple[GoldTrajectory, ...]


def few_shot_variation_order(env: SciWorldEnv, task: str) -> list[int]:
  """Train variations to draw examples from: first those outside the training variations (so an
  example is not the very episode being trained on), then the training variations from the last
  one back."""
  train = env.variations(task, "train")
  n_used = env.config.num_train_variations
  return train[n_used:] + train[:n_used][::-1]


def replay_gold(env: SciWorldEnv, task: str, variation: int) -> GoldTrajectory:
  """Replays the gold actions of a train variation until the episode ends. Replaces `env`'s
  current episode."""
  if variation not in env.variations(task, "train"):
    raise ValueError(
      f"Variation {variation} of {task!r} is not a train variation; few-shot "
      "examples must never come from dev or test variations."
    )
  gold = env.gold_actions(task, variation)
  first_obs, info = env.reset(task, variation)
  steps, score = [], 0
  for action in gold:
    obs, _, done, step_info = env.step(action)
    steps.append((step_info.executed_action, obs))
    score = step_info.score
    if done:
      break
  return GoldTrajectory(
    task=task,
    variation=variation,
    task_description=info.task_description,
    first_observation=first_obs,
    steps=tuple(steps),
    final_score=score,
  )


def gold_trajectories(
  env: SciWorldEnv, task: str, n: int = 2, max_candidates: int = 10
) -> list[GoldTrajectory]:
  """`n` successful gold trajectories of `task` from train variations (see
  `few_shot_variation_order`). Replaces `env`'s current episode."""
  if n < 0:
    raise ValueError(f"n={n} few-shot trajectories; pass n >= 0")
  out = []
  if n == 0:
    return out
  for variation in few_shot_variation_order(env, task)[:max_candidates]:
    traj = replay_gold(env, task, variation)
    if traj.final_score > env.config.success_score:
      out.append(traj)
    if len(out) == n:
      return out
  raise RuntimeError(
    f"Found only {len(out)} successful gold trajectories for {task!r} among "
    f"{max_candidates} train variations; raise max_candidates."
  )


def prompt_material(
  env: SciWorldEnv, task: str, variation: int, few_shot: tuple[GoldTrajectory, ...] = ()
) -> PromptMaterial:
  """Resets `env` to (task, variation) and gathers what the first prompt shows. Compute
  `few_shot` once per task with `gold_trajectories` and pass it in."""
  _, info = env.reset(task, variation)
  return PromptMaterial(
    task_description=info.task_description,
    action_templates=tuple(env.action_templates()),
    inventory=info.inventory,
    focus_items=tuple(env.focus_items()),
    few_shot=tuple(few_shot),
  )


def format_trajectory(traj: GoldTrajectory) -> str:
  """Plain-text rendering of a gold trajectory for a prompt."""
  lines = [f"Task: {traj.task_description}", f"Observation: {traj.first_observation.strip()}"]
  for action, obs in traj.steps:
    lines.append(f"Action: {action}")
    lines.append(f"Observation: {obs.strip()}")
  return "\n".join(lines)
