"""A small protocol for text environments, and the records they return.

An environment is reset to one (task, variation) and then stepped with free action text:

  obs, info = env.reset(task, variation)            # ResetResult
  obs, reward, done, info = env.step("open door")   # StepResult

Both results are NamedTuples, so they unpack like the usual Gym tuples and pickle cheaply across
process boundaries (the pool sends them between processes).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple, Protocol, Sequence, runtime_checkable

Split = Literal["train", "dev", "test"]
SPLITS: tuple[str, ...] = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class ResetInfo:
  task: str
  variation: int
  task_description: str
  inventory: str
  look: str  # the look-around text of the start room
  max_steps: int  # agent steps before the episode is cut off
  env_failed: bool = False  # the pool could not start this episode (repeated worker failures)


@dataclasses.dataclass(frozen=True)
class StepInfo:
  score: int  # simulator score after this step, 0..100, or -100 on failure
  valid: bool  # the raw text was accepted as-is (no correction needed)
  raw_action: str  # what the agent wrote, kept for its history
  executed_action: str  # what the simulator executed (after correction)
  moves: int  # simulator move counter
  steps: int  # agent steps taken in this episode, this one included
  truncated: bool  # ended by the agent step limit rather than by the simulator
  success: bool  # done and score above the success threshold
  env_failed: bool = False  # the pool gave up on this episode after repeated worker failures


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
