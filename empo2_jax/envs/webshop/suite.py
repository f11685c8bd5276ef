"""WebShop's registry entry (envs/registry.py): config.env -> WebShopConfig, pool workers, the local
env, prompt material and prompts.

config.env fields (configs/webshop.py sets them): data_dir ("" = the bundled fixture), goals
("synthetic" | "human"), price_seed, num_products (0 = all), num_test, num_dev,
num_train_variations / num_test_variations (0 = the whole split), max_steps (15), reward_mode
("score" | "verl" | "raw"), search_backend ("lucene" | "bm25s"), show_attrs. The pool's envs
show the agent's view of each page (observation "agent", prompts.py).

A worker process loads the catalogue and builds the search index once, and loads spaCy when it
starts (so the first purchase is not slow); with the full 1.18M-product catalogue each worker holds
its own index (several GB), so use few workers there.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.envs.registry import EnvSuite, register
from empo2_jax.envs.webshop import data as data_lib
from empo2_jax.envs.webshop import env as env_lib
from empo2_jax.envs.webshop import prompts

FIELDS = (
  "data_dir",
  "goals",
  "price_seed",
  "num_test",
  "num_dev",
  "num_train_variations",
  "num_test_variations",
  "reward_mode",
  "search_backend",
  "show_attrs",
)


def env_config(c) -> env_lib.WebShopConfig:
  """The WebShopConfig of config.env (keys absent from config.env keep the dataclass defaults)."""
  kw = {name: c.env[name] for name in FIELDS if name in c.env}
  if "num_products" in c.env:
    kw["num_products"] = c.env.num_products or None
  if c.env.get("max_steps"):
    kw["max_steps"] = c.env.max_steps
  return env_lib.WebShopConfig(observation="agent", **kw)


def check_config(c) -> None:
  """Bad fields raise ValueError naming the valid values; a data directory must hold the files."""
  cfg = env_config(c)
  try:
    data_lib.resolve_files(cfg.resolved_data_dir)
  except FileNotFoundError as e:
    raise ValueError(f"env.data_dir: {e}") from e


@dataclasses.dataclass(frozen=True)
class WebShopWorkers:
  """The pool's WorkerFactory (picklable: only the config travels)."""

  config: env_lib.WebShopConfig
  name: str = "webshop"

  @property
  def tasks(self) -> tuple[str, ...]:
    return env_lib.TASKS

  def max_steps(self, task: str) -> int:
    del task
    return self.config.max_steps

  def start(self) -> "_WebShopHost":
    return _WebShopHost(self.config)


class _WebShopHost:
  pid = 0  # no helper process

  def __init__(self, config: env_lib.WebShopConfig):
    from empo2_jax.envs.webshop import reward

    self.config = config
    env_lib.WebShopEnv(config)  # catalogue and index, shared by this worker's envs
    reward.nouns("warm up")  # loads the spaCy pipeline now

  def new_env(self) -> env_lib.WebShopEnv:
    return env_lib.WebShopEnv(self.config)

  def close(self) -> None:
    pass


def local_env(config: env_lib.WebShopConfig) -> env_lib.WebShopEnv:
  return env_lib.WebShopEnv(config)


def materials(env: env_lib.WebShopEnv, task: str, variations: Sequence[int], n_few_shot: int):
  """{(task, goal index): WebShopMaterial}. No few-shot examples (verl-agent's prompt has none)."""
  del n_few_shot
  env.variations(task, "test")  # checks the task name
  goals = env.catalog.goals
  return {
    (task, int(v)): prompts.WebShopMaterial(goals[int(v)]["instruction_text"]) for v in variations
  }


SUITE = register(
  EnvSuite(
    name="webshop",
    tasks=env_lib.TASKS,
    env_config=env_config,
    worker=WebShopWorkers,
    local_env=local_env,
    materials=materials,
    prompts=prompts.PROMPTS,
    check_config=check_config,
  )
)
