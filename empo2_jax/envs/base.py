"""A small protocol for text environments, and the records they return.

An environment is reset to one (task, variation) and then stepped with free action text:

  obs, info = env.reset(task, variation)            # ResetResult
  obs, reward, done, info = env.step("open door")   # StepResult

Both results are NamedTuples, so they unpack like the usual Gym tuples and pickle cheaply across
process boundaries (the pool sends them between processes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, NamedTuple, Optional, Protocol, Sequence
from typing import runtime_checkable

Split = Literal["train", "dev", "test"]
SPLITS: tuple[str, ...] = ("train", "dev", "test")

# JVM options of every ScienceWorld process (envs/scienceworld/env.py), defined here, the one place
# that the config (empo2_jax/defaults.py), the pool and ScienceWorld all import without py4j. The
# simulator lists a room's objects in an order that depends on Java identity hash codes, i.e. on
# what the process did before; hashCode=2 (a constant) makes observations independent of the
# process's history, which exact resume needs.
DEFAULT_JAVA_OPTIONS = "-Xmx512m -XX:+UnlockExperimentalVMOptions -XX:hashCode=2"


@dataclasses.dataclass(frozen=True)
class ResetInfo:
  """What a reset tells besides the first observation. Every environment fills task, variation,
  task_description and max_steps; the fields with defaults are optional (ScienceWorld fills
  inventory; the puzzles fill state)."""

  task: str
  variation: int
  task_description: str
  inventory: str = ""  # ScienceWorld: the agent's inventory text
  max_steps: int = 0  # agent steps (turns) before the episode is cut off
  env_failed: bool = False  # the pool could not start this episode (repeated worker failures)
  state: str = ""  # the bare state rendering where an env has one (puzzle grids; SPA's targets)


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What a step tells besides observation, reward and done. `score` is the episode's score so
  far: ScienceWorld's simulator score (0..100, -100 on failure); for environments with rewards
  (the puzzles) the return so far, so that an episode's return is its final score."""

  score: float
  valid: bool  # the raw text was accepted as-is (no correction needed)
  raw_action: str  # what the agent wrote, kept for its history
  executed_action: str  # what the environment executed (after correction / parsing)
  moves: int = 0  # environment move counter (ScienceWorld: simulator moves; puzzles: actions)
  steps: int = 0  # agent steps taken in this episode, this one included
  truncated: bool = False  # ended by a step/action limit rather than by the environment
  success: bool = False  # the environment's success criterion (ScienceWorld: done, score > 70)
  env_failed: bool = False  # the pool gave up on this episode after repeated worker failures
  state: str = ""  # the bare state rendering after this step, where an env has one
  # At the episode's end, where an env has subgoals: their progress (ScienceWorld's
  # getGoalProgressStr; HeRL's unmet goals, methods/herl.py). "" otherwise.
  goals: str = ""


class ResetResult(NamedTuple):
  observation: str
  info: ResetInfo


class StepResult(NamedTuple):
  observation: str
  reward: float  # score delta, so an episode's return equals its final score
  done: bool
  info: StepInfo


@runtime_checkable
class TextEnv(Protocol):
  """What the actor needs from an environment."""

  @property
  def tasks(self) -> Sequence[str]: ...

  def variations(self, task: str, split: Split) -> list[int]:
    """Every variation of `task` in `split`, in the simulator's order."""
    ...

  def reset(self, task: str, variation: int) -> ResetResult: ...

  def step(self, action_text: str) -> StepResult: ...

  def close(self) -> None: ...


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r}; expected one of {SPLITS}.")


def check_task(task: str, tasks: Sequence[str]) -> None:
  if task not in tasks:
    raise ValueError(f"Unknown task {task!r}. Valid tasks: {', '.join(tasks)}.")


@runtime_checkable
class WorkerHost(Protocol):
  """What one pool worker process holds: it makes the envs of the worker's slots."""

  @property
  def pid(self) -> int:
    """A helper process that must die with the worker (ScienceWorld: its JVM); 0 when none."""
    ...

  def new_env(self) -> TextEnv: ...

  def close(self) -> None: ...


@runtime_checkable
class WorkerFactory(Protocol):
  """Picklable recipe for a pool worker's envs (sent to a spawned process, so it must pickle):
  `start()` runs in the worker process and returns its WorkerHost; the parent uses `name`,
  `tasks` and `max_steps` (failure records, input checks)."""

  name: str

  @property
  def tasks(self) -> Sequence[str]: ...

  def max_steps(self, task: str) -> int: ...

  def start(self) -> WorkerHost: ...


@dataclasses.dataclass(frozen=True)
class PromptSet:
  """An environment's messages. first(material, observation, tips) opens the episode (material:
  what the env's registry entry built for (task, variation); it must have `task_description`,
  which the memory keys use); step(observation, tips) follows each action; score_out_of is the
  score's maximum shown in tips and memories ("score 40/100"), None for a return without one."""

  first_user_message: Callable[[Any, str, Sequence[str]], str]
  step_user_message: Callable[[str, Sequence[str]], str]
  score_out_of: Optional[float] = 100
