"""The environment registry: lookup, errors that name the valid values, registration, and the
ScienceWorld entry matching what the trainer built before the registry existed."""

import pickle

import pytest

from configs import sciworld
from empo2_jax.agent import prompts
from empo2_jax.envs.scienceworld.prompts import SCIENCEWORLD
from empo2_jax.envs import pool as pool_lib
from empo2_jax.envs import registry
from empo2_jax.envs.base import WorkerFactory
from empo2_jax.train import build


def test_unknown_name_lists_the_valid_names():
  with pytest.raises(ValueError, match=r"env.name='sciworld'; valid: .*scienceworld"):
    registry.get_suite("sciworld")
  c = sciworld.get_config("cpu")
  c.unlock()
  c.env.name = "scienceworlds"
  with pytest.raises(build.ConfigError, match="valid: .*scienceworld"):
    build.check_config(c)


def test_bad_task_and_env_fields_are_config_errors():
  c = sciworld.get_config("cpu")
  c.env.task = "find-plants"
  with pytest.raises(build.ConfigError, match="valid for scienceworld: .*find-plant"):
    build.check_config(c)
  c = sciworld.get_config("cpu")
  c.env.action_correction = "sometimes"
  with pytest.raises(build.ConfigError, match="on_reject, always"):
    build.check_config(c)


def test_scienceworld_entry():
  from empo2_jax import defaults
  from empo2_jax.envs.base import DEFAULT_JAVA_OPTIONS
  from empo2_jax.envs.scienceworld.env import ALL_TASKS, SciWorldConfig

  suite = registry.get_suite("scienceworld")
  assert suite is registry.get_suite("scienceworld")
  assert suite.tasks == ALL_TASKS and suite.prompts is SCIENCEWORLD
  # one definition of the JVM options: the config's, the pool's and ScienceWorld's default
  assert defaults.get_config().env.java_tool_options == DEFAULT_JAVA_OPTIONS
  assert pool_lib.PoolConfig().java_tool_options == DEFAULT_JAVA_OPTIONS
  assert SciWorldConfig().java_tool_options == DEFAULT_JAVA_OPTIONS
  c = sciworld.get_config("cpu")
  cfg = build.env_config(c)
  assert cfg == SciWorldConfig(
    default_max_steps=4, max_steps_overrides=(), num_train_variations=2, num_test_variations=2
  )
  factory = suite.worker(cfg)
  assert isinstance(factory, WorkerFactory)
  assert pickle.loads(pickle.dumps(factory)) == factory  # it travels to spawned workers
  assert factory.max_steps("find-animal") == 4 and factory.tasks == ALL_TASKS
  # EnvPool(SciWorldConfig) still works: it becomes this factory with the pool's JVM options.
  wrapped = pool_lib.worker_factory(
    SciWorldConfig(), pool_lib.PoolConfig(java_tool_options="-Xmx1g")
  )
  assert wrapped.config.java_tool_options == "-Xmx1g" and wrapped.name == "sciworld"
  with pytest.raises(TypeError, match="WorkerFactory"):
    pool_lib.worker_factory(object(), pool_lib.PoolConfig())


def test_register_at_run_time():
  base = registry.get_suite("scienceworld")
  suite = registry.EnvSuite(
    name="test-env-registry",
    tasks=["only"],
    env_config=base.env_config,
    worker=base.worker,
    local_env=base.local_env,
    materials=base.materials,
    prompts=base.prompts,
  )
  assert registry.register(suite) is suite and registry.register(suite) is suite
  assert registry.get_suite("test-env-registry").tasks == ("only",)
  assert "test-env-registry" in registry.names() and "scienceworld" in registry.names()
  clash = registry.EnvSuite(**{**suite.__dict__, "tasks": ("other",)})
  with pytest.raises(ValueError, match="already registered"):
    registry.register(clash)
  with pytest.raises(ValueError, match="valid for test-env-registry: only"):
    suite.check_task("none")
  with pytest.raises(ValueError, match="at least one task"):
    registry.EnvSuite(**{**suite.__dict__, "tasks": ()})


def test_outcome_and_memory_text_with_and_without_a_maximum():
  from empo2_jax.memory.reflect import memory_text

  assert prompts.outcome_message(" end. ", 40) == (
    "Observation: end.\n\nThe episode is over; your final score is 40/100.\n\n"
  )
  assert "score is 0.8.\n" in prompts.outcome_message("x", 0.8, None)
  assert memory_text("t", "Left", 1.0, None).endswith("you got the score 1.")
  assert memory_text("t", "look", 25).endswith("you got the score 25/100.")
