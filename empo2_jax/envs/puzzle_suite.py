"""A puzzle env (envs/puzzles.PuzzleEnv) as an env suite: the pool's workers, the prompt material
(the rules, few-shot gold episodes of other train seeds), the user messages, and the registration
(`register_suite`, which envs/frozenlake.py and envs/sokoban.py call).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.envs import registry
from empo2_jax.envs.base import PromptSet
from empo2_jax.envs.fewshot import GoldTrajectory, format_trajectory
from empo2_jax.envs.puzzles import ACTION_SEP, PuzzleConfig, PuzzleEnv, seeds
from empo2_jax.tips import tip_block


# ----------------------------------------------------------------------- pool workers
@dataclasses.dataclass(frozen=True)
class PuzzleWorkers:
  """The pool's WorkerFactory for a puzzle (picklable: the env class and its config)."""

  env_cls: type
  config: PuzzleConfig
  name: str = "puzzle"

  @property
  def tasks(self) -> tuple[str, ...]:
    return (self.env_cls.task,)

  def max_steps(self, task: str) -> int:
    return self.config.max_steps(task)

  def start(self) -> "_PuzzleHost":
    return _PuzzleHost(self.env_cls, self.config)


class _PuzzleHost:
  pid = 0  # no helper process

  def __init__(self, env_cls: type, config: PuzzleConfig):
    self.env_cls, self.config = env_cls, config

  def new_env(self) -> PuzzleEnv:
    return self.env_cls(self.config)

  def close(self) -> None:
    pass


# ----------------------------------------------------------------------- prompts
@dataclasses.dataclass(frozen=True)
class PuzzleMaterial:
  task_description: str
  instruction: str  # rules, symbols, action words, the per-turn limit
  few_shot: tuple[GoldTrajectory, ...] = ()


def replay_gold(env: PuzzleEnv, task: str, variation: int) -> tuple[GoldTrajectory, bool]:
  """(the gold turns of a TRAIN variation replayed through `env`, whether they solved it)."""
  if variation not in seeds("train"):
    raise ValueError(f"Variation {variation} is not a train seed; few-shot examples are train only")
  turns = env.gold_actions(task, variation)
  first, info = env.reset(task, variation)
  steps, score, success = [], 0.0, False
  for text in turns:
    obs, _, done, step_info = env.step(text)
    steps.append((step_info.executed_action, obs))
    score, success = step_info.score, step_info.success
    if done:
      break
  traj = GoldTrajectory(task, variation, info.task_description, first, tuple(steps), score)
  return traj, success


def gold_trajectories(
  env: PuzzleEnv, task: str, n: int, exclude: Sequence[int] = (), max_candidates: int = 200
) -> list[GoldTrajectory]:
  """`n` solved gold episodes of train seeds after the training variations (never one of them)."""
  out = []
  if n <= 0:
    return out
  skip = set(int(v) for v in exclude)
  for v in seeds("train")[env.config.num_train_variations :][:max_candidates]:
    if v in skip:
      continue
    traj, success = replay_gold(env, task, v)
    if success:
      out.append(traj)
    if len(out) == n:
      return out
  raise RuntimeError(f"only {len(out)} solved gold episodes among {max_candidates} train seeds")


def materials(env: PuzzleEnv, task: str, variations: Sequence[int], n_few_shot: int) -> dict:
  """{(task, variation): PuzzleMaterial}; the examples come from other train seeds."""
  shots = tuple(gold_trajectories(env, task, n_few_shot, exclude=variations))
  material = PuzzleMaterial(env.task_description, env.instruction(), shots)
  return {(task, int(v)): material for v in variations}


CLOSING = (
  f"Reply with your next action or actions on a single line, separated by ' {ACTION_SEP} ', "
  "with no explanation."
)


def first_user_message(material: PuzzleMaterial, observation: str, tips: Sequence[str] = ()) -> str:
  parts = [material.instruction.strip()]
  for i, traj in enumerate(material.few_shot):
    parts.append(f"Example {i + 1} (a solved puzzle, another map):\n{format_trajectory(traj)}")
  parts.append(f"State:\n{observation.strip()}")
  return "\n\n".join(parts) + "\n\n" + tip_block(tips) + CLOSING


def step_user_message(observation: str, tips: Sequence[str] = ()) -> str:
  return f"State:\n{observation.strip()}\n\n" + tip_block(tips) + CLOSING


# The return has no fixed maximum (Sokoban: -0.1 a step, +1/-1 box on/off target, +10 solved).
PROMPTS = PromptSet(first_user_message, step_user_message, score_out_of=None)


def env_fields(c, *names: str) -> dict:
  """The PuzzleConfig fields set in config.env (the puzzle configs add them; keys that are
  absent keep the dataclass defaults)."""
  return {n: c.env[n] for n in names if n in c.env}


COMMON_FIELDS = (
  "render",
  "max_turns",
  "max_actions_per_turn",
  "max_actions",
  "format_penalty",
  "num_train_variations",
  "num_test_variations",
)


def register_suite(env_cls: type, config_cls: type, *fields: str):
  """Registers a puzzle env (a PuzzleEnv subclass with its `task`) as an env suite: its config
  comes from config.env's COMMON_FIELDS and `fields` (env.max_steps, when set, is the turn
  limit); building it raises ValueError on a bad field, which is the suite's config check."""

  def env_config(c):
    kw = env_fields(c, *COMMON_FIELDS, *fields)
    if c.env.max_steps:
      kw["max_turns"] = c.env.max_steps
    return config_cls(**kw)

  return registry.register(
    registry.EnvSuite(
      name=env_cls.task,
      tasks=(env_cls.task,),
      env_config=env_config,
      worker=lambda cfg: PuzzleWorkers(env_cls, cfg, name=env_cls.task),
      local_env=env_cls,
      materials=materials,
      prompts=PROMPTS,
      check_config=env_config,
    )
  )
