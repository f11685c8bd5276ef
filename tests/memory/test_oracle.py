"""Oracle memories (memory/oracle.py, config memory.oracle): each training variation's slot holds
its own gold path as the one tip, every step retrieves it whatever its key, and the config refuses
an oracle memory that the run could change. ScienceWorld's tips are checked against the raw
library's gold action sequences."""

import os

import numpy as np
import pytest

from empo2_jax.agent.memory import Memory
from empo2_jax.defaults import load_config
from empo2_jax.memory.oracle import oracle_actions, oracle_store, oracle_tip
from empo2_jax.train import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Words:
  """A bag-of-letters encoder: unrelated texts get low cosines, as real keys can."""

  dim = 26

  def encode(self, texts):
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for ch in t.lower():
        if "a" <= ch <= "z":
          out[i, ord(ch) - 97] += 1
    out += 1e-3
    return out / np.linalg.norm(out, axis=1, keepdims=True)


class GoldEnv:
  def __init__(self, paths):
    self.paths = paths

  def gold_actions(self, task, variation):
    return self.paths[variation]


def test_the_tip_lists_the_gold_actions_in_order():
  assert oracle_tip(["open  door", "go to kitchen"]) == (
    "The actions that complete this task, in order: open door; go to kitchen."
  )
  for bad in ([], ["look", " "]):
    with pytest.raises(ValueError, match="gold path"):
      oracle_tip(bad)
  path = ["open door to kitchen", "go to kitchen", "focus on soap"]
  assert oracle_actions(oracle_tip(path)) == path
  with pytest.raises(ValueError, match="not an oracle tip"):
    oracle_actions("Actions that raised the score: look around (+8)")


def _config(**memory):
  c = load_config(os.path.join(ROOT, "configs", "vault.py:tiny"))
  c.unlock()
  for k, v in memory.items():
    setattr(c.memory, k, v)
  c.lock()
  return c


def test_every_step_of_a_variation_retrieves_its_own_gold_path_and_only_it():
  paths = {3: ["zzz qqq"], 7: ["abc", "abd"], 9: ["kkk"]}
  store = oracle_store(Words(), GoldEnv(paths), "t", [3, 7, 9])
  assert len(store) == 3
  _, _, oracle_index = build.memory(_config(oracle=True, frozen=True))
  _, _, plain_index = build.memory(_config())
  oracle_mem = Memory(Words(), store, oracle_index)
  oracle_mem.replace_store(store)
  keys = ["aaaa", "a step whose chat shares nothing with the key", "xyz"]
  slots = [("t", 3), ("t", 7), ("t", 9)]
  got = oracle_mem.retrieve(slots, keys)
  assert got == [[oracle_tip(paths[v])] for v in (3, 7, 9)]
  # the same store under the ordinary threshold misses a step whose key is unlike the entry's
  plain = Memory(Words(), store, plain_index)
  plain.replace_store(store)
  assert plain.retrieve([("t", 3)], ["aaaa"]) == [[]]
  with pytest.raises(ValueError, match="repeat"):
    oracle_store(Words(), GoldEnv(paths), "t", [3, 3])


def test_an_oracle_memory_must_be_frozen_and_built_here():
  with pytest.raises(build.ConfigError, match="memory.frozen=True"):
    build.check_config(_config(oracle=True))
  with pytest.raises(build.ConfigError, match="init_from"):
    build.check_config(_config(oracle=True, frozen=True, init_from="/some/run"))
  build.check_config(_config(oracle=True, frozen=True))


def test_a_runs_rollout_setup_installs_one_gold_tip_per_training_variation():
  c = _config(oracle=True, frozen=True)
  pool, train_vars, _, _, mem = build.rollout_setup(c)
  try:
    env = build.suite(c).local_env(build.env_config(c))
    assert len(mem.store) == len(train_vars)
    got = mem.retrieve([(c.env.task, v) for v in train_vars], ["anything"] * len(train_vars))
    assert got == [[oracle_tip(env.gold_actions(c.env.task, v))] for v in train_vars]
  finally:
    pool.close()


def test_sciworld_gold_tips_are_the_librarys_gold_action_sequences(monkeypatch):
  from scienceworld import ScienceWorldEnv

  from empo2_jax.envs.base import DEFAULT_JAVA_OPTIONS

  c = load_config(os.path.join(ROOT, "configs", "sciworld.py:tiny"))
  env = build.suite(c).local_env(build.env_config(c))
  task = c.env.task
  try:
    variations = env.used_variations(task, "train")[:2]
    store = oracle_store(Words(), env, task, variations)
    tips = {v: store.slot((task, v)).texts for v in variations}
    simplification = env.config.simplification
  finally:
    env.close()
  monkeypatch.setenv("JAVA_TOOL_OPTIONS", DEFAULT_JAVA_OPTIONS)
  lib = ScienceWorldEnv("")
  try:
    for v in variations:
      lib.load(task, v, simplification, True)  # True: generate the gold path
      want = oracle_tip([str(a) for a in lib.get_gold_action_sequence()])
      assert tips[v] == [want]
  finally:
    lib.close()
