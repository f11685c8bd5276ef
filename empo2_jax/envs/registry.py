"""The environments the trainer can run, one `EnvSuite` each, looked up by config.env.name.

    suite = registry.get_suite(config.env.name)     # a typo names the valid names
    env_cfg = suite.env_config(config)              # the env's own frozen, picklable config
    pool = EnvPool(suite.worker(env_cfg), PoolConfig(...))   # worker processes step the episodes
    env = suite.local_env(env_cfg)                  # in-process: variations, gold runs, prompts
    variations = env.used_variations(task, "train")
    materials = suite.materials(env, task, variations, n_few_shot)  # {(task, variation): material}
    suite.prompts.first_user_message(materials[(task, v)], observation, tips)

What an EnvSuite holds:
  name          config.env.name
  tasks         the valid config.env.task values
  env_config    config -> the env's own config object (frozen dataclass; it travels to workers)
  worker        env config -> a picklable `base.WorkerFactory`: `start()` runs in each pool worker
                process and returns a host whose `new_env()` makes one `base.TextEnv` per slot
                (ScienceWorld: one JVM per worker, pid reported so the pool can kill it)
  local_env     env config -> an in-process TextEnv that also has `variations(task, split)` (all
                of a split), `used_variations(task, split)` (the first num_<split>_variations,
                what a run uses) and `close()`; it replays gold trajectories, so it has no agent
                step limit
  materials     (local env, task, variations, n_few_shot) -> {(task, variation): material}, the
                material being whatever `prompts.first_user_message` reads; it must have a
                `task_description` (the memory keys start with it)
  prompts       an `envs.base.PromptSet`: first/step user messages (use `tips.tip_block`
                for tips, so the memory and the tip-free batch views work unchanged) and the
                score's maximum shown in tips ("40/100"; None for a return without one)
  check_config  config -> None, raises ValueError naming the valid values of a bad env.* field
                (build.check_config reports it as a ConfigError before anything starts)

Registering a new environment is one call in its own module, plus one line here so that
config.env.name finds the module without importing every environment up front:

    # empo2_jax/envs/myenv.py
    SUITE = registry.register(registry.EnvSuite(name="myenv", tasks=(...), ...))

    # this file, BUILTIN:
    "myenv": "empo2_jax.envs.myenv",

`register` also works on its own (tests, plugins): a suite registered at run time is found by
`get_suite` without a BUILTIN line. Importing this module imports no environment.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Sequence

# name -> the module whose import registers it (each module registers `SUITE` when imported).
BUILTIN: dict[str, str] = {
  "scienceworld": "empo2_jax.envs.scienceworld.suite",
  "frozenlake": "empo2_jax.envs.frozenlake",
  "sokoban": "empo2_jax.envs.sokoban",
  "webshop": "empo2_jax.envs.webshop.suite",
  "vault": "empo2_jax.envs.vault",
}

_REGISTERED: dict[str, "EnvSuite"] = {}


def _no_check(c) -> None:
  del c


@dataclasses.dataclass(frozen=True)
class EnvSuite:
  """One environment as the trainer sees it; see the module docstring for each field."""

  name: str
  tasks: tuple[str, ...]
  env_config: Callable[[Any], Any]
  worker: Callable[[Any], Any]
  local_env: Callable[[Any], Any]
  materials: Callable[[Any, str, Sequence[int], int], dict]
  prompts: Any  # envs.base.PromptSet
  check_config: Callable[[Any], None] = _no_check

  def __post_init__(self):
    if not self.name or not self.tasks:
      raise ValueError(f"an EnvSuite needs a name and at least one task, got {self.name!r}")
    object.__setattr__(self, "tasks", tuple(self.tasks))

  def check_task(self, task: str) -> None:
    if task not in self.tasks:
      raise ValueError(f"env.task={task!r}; valid for {self.name}: {', '.join(self.tasks)}")


def register(suite: EnvSuite) -> EnvSuite:
  """Adds `suite` under its name (again with the same suite is a no-op); returns it."""
  if not isinstance(suite, EnvSuite):
    raise TypeError(f"register needs an EnvSuite, got {type(suite).__name__}")
  old = _REGISTERED.get(suite.name)
  if old is not None and old is not suite:
    raise ValueError(f"an environment named {suite.name!r} is already registered")
  _REGISTERED[suite.name] = suite
  return suite


def names() -> list[str]:
  """Every valid config.env.name, builtin or registered."""
  return sorted(set(BUILTIN) | set(_REGISTERED))


def get_suite(name: str) -> EnvSuite:
  """The EnvSuite called `name`; an unknown name raises ValueError naming the valid ones."""
  if name not in _REGISTERED and name in BUILTIN:
    module = importlib.import_module(BUILTIN[name])
    if name not in _REGISTERED:  # a module that defines SUITE without registering it
      register(getattr(module, "SUITE"))
  if name not in _REGISTERED:
    raise ValueError(f"env.name={name!r}; valid: {', '.join(names())}")
  return _REGISTERED[name]
