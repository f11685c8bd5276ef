"""ScienceWorld's registry entry (envs/registry.py): its pool workers (one JVM per worker process,
shared by the worker's slots), the SciWorldConfig of config.env, the local env for rows, gold
trajectories and prompt material, and its prompts (envs/scienceworld/prompts.py).

Importing this module imports py4j and the scienceworld package but starts no JVM.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.envs.scienceworld.prompts import SCIENCEWORLD
from empo2_jax.envs.registry import EnvSuite, register
from empo2_jax.envs.scienceworld.env import ALL_TASKS, SciWorldConfig, SciWorldEnv, ScienceWorldJvm


@dataclasses.dataclass(frozen=True)
class SciWorldWorkers:
  """The pool's WorkerFactory for ScienceWorld (picklable: only the config travels)."""

  config: SciWorldConfig = SciWorldConfig()
  name: str = "sciworld"  # the worker processes are named "sciworld-worker"

  @property
  def tasks(self) -> tuple[str, ...]:
    return ALL_TASKS

  def max_steps(self, task: str) -> int:
    return self.config.max_steps(task)

  def start(self) -> "_SciWorldHost":
    return _SciWorldHost(self.config)


class _SciWorldHost:
  """One JVM per worker process; every slot's SciWorldEnv is a simulator inside it."""

  def __init__(self, config: SciWorldConfig):
    self.config = config
    self.jvm = ScienceWorldJvm(config.java_tool_options)

  @property
  def pid(self) -> int:
    return self.jvm.pid

  def new_env(self) -> SciWorldEnv:
    return SciWorldEnv(self.config, jvm=self.jvm)

  def close(self) -> None:
    self.jvm.close()


def env_config(c) -> SciWorldConfig:
  """The SciWorldConfig of config.env (the agent's step limit included)."""
  kw = dict(
    simplification=c.env.simplification,
    num_train_variations=c.env.num_train_variations,
    num_test_variations=c.env.num_test_variations,
    java_tool_options=c.env.java_tool_options,
    action_correction=c.env.action_correction,
  )
  if c.env.max_steps:
    kw.update(default_max_steps=c.env.max_steps, max_steps_overrides=())
  return SciWorldConfig(**kw)


def local_env(config: SciWorldConfig) -> SciWorldEnv:
  """An in-process env for rows, gold replays and prompt material: gold trajectories are replayed
  to their end (without the agent step limit of the demo configs) and as written
  (action_correction="on_reject": the simulator accepts every gold action, while the agent's
  "always" would map e.g. "open door to kitchen" of an open door to "close door to kitchen" and
  put that into the few-shot examples and the SFT data)."""
  return SciWorldEnv(
    dataclasses.replace(
      config, default_max_steps=1000, max_steps_overrides=(), action_correction="on_reject"
    )
  )


def materials(env: SciWorldEnv, task: str, variations: Sequence[int], n_few_shot: int) -> dict:
  """{(task, variation): PromptMaterial}, the few-shot examples from train variations only."""
  from empo2_jax.envs import fewshot

  shots = tuple(fewshot.gold_trajectories(env, task, n=n_few_shot))
  return {(task, int(v)): fewshot.prompt_material(env, task, int(v), shots) for v in variations}


def check_config(c) -> None:
  if c.env.action_correction not in ("on_reject", "always"):
    raise ValueError(f"env.action_correction={c.env.action_correction!r}; valid: on_reject, always")


SUITE = register(
  EnvSuite(
    name="scienceworld",
    tasks=ALL_TASKS,
    env_config=env_config,
    worker=SciWorldWorkers,
    local_env=local_env,
    materials=materials,
    prompts=SCIENCEWORLD,
    check_config=check_config,
  )
)
