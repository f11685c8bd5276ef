"""The vault env (envs/vault.py): the code never shows in what the agent reads, only the exact code
is rewarded (every one of the 64 answers tried), the partial score, the gold plan, the config's
checks, and a memory of one tip a vault that retrieves only its own vault's tip."""

import itertools

import numpy as np
import pytest

from empo2_jax.envs import registry, vault
from empo2_jax.envs.vault import BUTTONS, VaultConfig, VaultEnv, code_text, vault_code, vault_name

TASK = vault.TASK


def _prompt(env, seed, tips=()):
  obs, info = env.reset(TASK, seed)
  material = vault.materials(env, TASK, [seed], 0)[(TASK, seed)]
  return vault.first_user_message(material, obs, tips), info


@pytest.mark.parametrize("seed", [0, 3, 7, 1_000_001, 2_000_005])
def test_every_answer_tried_only_the_exact_code_scores(seed):
  env = VaultEnv(VaultConfig())
  code = vault_code(seed)
  rewarded = []
  for answer in itertools.product(BUTTONS, repeat=3):
    env.reset(TASK, seed)
    obs, reward, done, info = env.step(code_text(answer))
    assert done and info.steps == 1 and info.moves == 3  # one turn, three presses
    assert reward == float(list(answer) == code) == float(info.success)
    rewarded.append(reward)
  assert sum(rewarded) == 1.0  # one code of 64
  env.reset(TASK, seed)  # the puzzles' tolerant reading: case, other separators
  assert env.step(", ".join(code).upper()).reward == 1.0


def test_the_code_is_not_in_what_the_agent_reads():
  """Two vaults' prompts differ only in the vault's name, so nothing in them tells the code."""
  env = VaultEnv(VaultConfig())
  prompts, codes = {}, {}
  for seed in range(40):
    prompts[seed], info = _prompt(env, seed)
    codes[seed] = vault_code(seed)
    assert code_text(codes[seed]) not in prompts[seed]
    assert info.state == f"Vault: {vault_name(seed)}."
  assert len({tuple(c) for c in codes.values()}) > 20  # the codes do differ
  for seed in range(1, 40):
    assert prompts[seed].replace(vault_name(seed), "N") == prompts[0].replace(vault_name(0), "N")
  # after the answer, the observation is the same line: no feedback on the code either
  obs, *_ = env.step("red || red || red")
  assert obs == f"Vault: {vault_name(39)}."


def test_names_and_codes_are_independent_draws_of_the_seed():
  counts = np.zeros((4, 4))
  for seed in range(4000):
    c = vault_code(seed)
    counts[BUTTONS.index(c[0]), BUTTONS.index(c[1])] += 1
  # first two buttons roughly uniform over the 16 pairs (chi-square, 15 dof, p ~ 1e-4 at 45)
  expected = 4000 / 16
  assert np.sum((counts - expected) ** 2 / expected) < 45
  assert vault_code(5) == vault_code(5) and vault_name(5) == vault_name(5)


def test_partial_score_pays_each_button_in_place():
  env = VaultEnv(VaultConfig(partial_score=True))
  code = vault_code(2)
  wrong = [b for b in BUTTONS if b != code[1]][0]
  env.reset(TASK, 2)
  _, reward, _, info = env.step(code_text([code[0], wrong, code[2]]))
  assert reward == pytest.approx(2 / 3) and not info.success
  env.reset(TASK, 2)
  assert env.step(code_text(code)).reward == pytest.approx(1.0)


def test_gold_plan_is_the_code_and_the_config_checks():
  env = VaultEnv(VaultConfig())
  assert env.gold_plan(TASK, 4) == vault_code(4)
  assert env.gold_actions(TASK, 4) == [code_text(vault_code(4))]
  with pytest.raises(ValueError, match="env.max_steps=1"):
    VaultConfig(max_turns=2)
  with pytest.raises(ValueError, match="distinct buttons"):
    VaultConfig(buttons=("red", "red"))
  suite = registry.get_suite("vault")
  assert suite.tasks == (TASK,) and suite.prompts.score_out_of is None


def test_a_vault_retrieves_only_its_own_tip():
  """The bench's memory (train/vault_data.vault_memory): one tip in each vault's slot; each vault
  retrieves its own from its own key, never another's (memory per variation)."""
  from empo2_jax.agent.memory import Memory, chat_key
  from empo2_jax.memory.index import MemoryIndex
  from empo2_jax.model.encoder import Encoder
  from empo2_jax.train import vault_data

  encoder = Encoder.load()
  env = VaultEnv(VaultConfig())
  vaults = [0, 1, 2, 3]
  tips = {v: vault_data.oracle_tip(v, env.config) for v in vaults}
  store = vault_data.vault_memory(encoder, env, vaults, tips)
  memory = Memory(encoder, store, MemoryIndex(store))
  keys = [chat_key(vault_data.first_message(env, v), encoder) for v in vaults]
  got = memory.retrieve([(TASK, v) for v in vaults], keys)
  assert got == [[tips[v]] for v in vaults]
  assert code_text(vault_code(2)) in tips[2] and "score 1" in tips[2]
  # a vault with no slot retrieves nothing (an unseen vault in training)
  assert memory.retrieve([(TASK, 9)], keys[:1]) == [[]]


def test_distinct_codes_keeps_each_splits_first_vaults_of_new_codes():
  """env.distinct_codes: a split's used vaults are, in seed order, the first N whose code no
  earlier kept vault has (checked against a plain loop over the seeds); off, the first N seeds."""
  from empo2_jax.envs import puzzles

  cfg = VaultConfig(num_train_variations=8, num_test_variations=16, distinct_codes=True)
  env = VaultEnv(cfg)
  for split, n in (("train", 8), ("test", 16)):
    got = env.used_variations(TASK, split)
    want, seen = [], []
    for s in puzzles.seeds(split):
      if vault_code(s) not in seen:
        want.append(s)
        seen.append(vault_code(s))
      if len(want) == n:
        break
    assert got == want and len({tuple(vault_code(s)) for s in got}) == n
  # the default keeps the first seeds; the train split's seeds 0 and 6 share a code
  plain = VaultEnv(VaultConfig(num_train_variations=8)).used_variations(TASK, "train")
  assert plain == list(range(8)) and vault_code(0) == vault_code(6)
  assert 6 not in env.used_variations(TASK, "train")
  too_many = VaultEnv(VaultConfig(num_train_variations=65, distinct_codes=True))
  with pytest.raises(ValueError, match="distinct codes"):
    too_many.used_variations(TASK, "train")
