"""Vault: a one-turn task whose answer only a memory tip can give (docs/vault_bench.md).

A variation is a named vault ("Amber Heron") with a secret code of `code_length` buttons drawn
from `buttons` (4 buttons, 3 presses: chance 1/64). Name and code derive from the variation's seed
by separate random streams, so the name says nothing about the code. The observation shows the
vault's name and never its code; the agent answers once ("red || blue || gold", the puzzles'
action syntax, envs/puzzles.py parse_actions) and the episode ends. Reward 1 for the exact code, 0
otherwise; with `partial_score` each button in its right place is worth 1 / code_length instead
(off by default).

The gold plan is the code, so launch/sft.py's gold checks and scripts/gold_replay.py work as for the
other puzzles. Memory is per variation as for every env (docs/fidelity.md), so a vault retrieves
only its own tips. The vault bench's primary runs start from oracle tips: for each vault the memory
text a successful episode of the rule reflector (memory/rule_tip.py) writes, i.e. its code in the
rule-tip format (train/vault_bench.py oracle_tip).

Splits are the puzzles' seed ranges (train, dev, test); `vault_name` and `vault_code` take any
seed, so data outside every split (the bench's format SFT) is built from the same functions.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from empo2_jax.envs import puzzle_suite, puzzles, registry
from empo2_jax.envs.base import PromptSet, Split
from empo2_jax.envs.puzzles import Game, PuzzleConfig, PuzzleEnv
from empo2_jax.tips import tip_block

TASK = "vault"
BUTTONS = ("red", "green", "blue", "gold")
ADJECTIVES = (
  "Amber", "Ashen", "Azure", "Brass", "Bronze", "Cedar", "Cobalt", "Copper",
  "Crimson", "Dusky", "Ember", "Fallow", "Frost", "Golden", "Granite", "Hazel",
  "Indigo", "Iron", "Ivory", "Jade", "Lunar", "Maple", "Misty", "Onyx",
  "Pale", "Quiet", "Russet", "Silver", "Slate", "Stone", "Velvet", "Willow",
)  # fmt: skip
NOUNS = (
  "Badger", "Bison", "Crane", "Falcon", "Finch", "Fox", "Hare", "Hawk",
  "Heron", "Ibis", "Jackal", "Kestrel", "Lark", "Lynx", "Marten", "Moose",
  "Newt", "Otter", "Owl", "Panther", "Puffin", "Raven", "Robin", "Salmon",
  "Stag", "Stork", "Swan", "Tern", "Tiger", "Viper", "Walrus", "Wren",
)  # fmt: skip
_CODE_STREAM, _NAME_STREAM = 7, 11


def vault_name(seed: int) -> str:
  """The vault's name (one of len(ADJECTIVES) * len(NOUNS) names; different seeds may share
  one: a user of several vaults checks that its names differ, as the bench does)."""
  rng = np.random.default_rng([int(seed), _NAME_STREAM])
  a, n = rng.integers(len(ADJECTIVES)), rng.integers(len(NOUNS))
  return f"{ADJECTIVES[a]} {NOUNS[n]}"


def vault_code(seed: int, length: int = 3, buttons: Sequence[str] = BUTTONS) -> list[str]:
  """The vault's secret code: `length` buttons, each uniform over `buttons`."""
  rng = np.random.default_rng([int(seed), _CODE_STREAM])
  return [buttons[int(i)] for i in rng.integers(len(buttons), size=length)]


def code_text(code: Sequence[str]) -> str:
  """A code as the agent answers it: "red || blue || gold"."""
  return f" {puzzles.ACTION_SEP} ".join(code)


@dataclasses.dataclass(frozen=True)
class VaultConfig(PuzzleConfig):
  max_turns: int = 1
  max_actions_per_turn: int = 3
  max_actions: int = 3
  format_penalty: float = 0.0
  code_length: int = 3
  buttons: tuple = BUTTONS
  partial_score: bool = False  # 1/code_length per button in its place instead of all-or-nothing
  # used_variations: each split's first N vaults whose codes differ from every earlier one kept
  distinct_codes: bool = False

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "buttons", tuple(self.buttons))
    if self.code_length < 1 or len(self.buttons) < 2 or len(set(self.buttons)) != len(self.buttons):
      raise ValueError(
        f"vault needs code_length >= 1 and >= 2 distinct buttons, got {self.code_length}, "
        f"{self.buttons}"
      )
    if self.max_turns != 1 or self.max_actions != self.code_length:
      raise ValueError(
        f"a vault episode is one answer of code_length={self.code_length} buttons: set "
        f"env.max_steps=1 and env.max_actions={self.code_length} (got {self.max_turns}, "
        f"{self.max_actions})"
      )


class VaultGame(Game):
  def __init__(self, seed: int, config: VaultConfig):
    self.actions = config.buttons
    self.name = vault_name(seed)
    self.code = vault_code(seed, config.code_length, config.buttons)
    self.partial = config.partial_score
    self.entered: list[str] = []

  def step(self, action: int) -> tuple[float, bool]:
    self.entered.append(self.actions[action])
    n = len(self.code)
    if self.partial:
      reward = float(self.entered[-1] == self.code[len(self.entered) - 1]) / n
    else:
      reward = float(len(self.entered) == n and self.entered == self.code)
    return reward, len(self.entered) == n

  @property
  def success(self) -> bool:
    return self.entered == self.code

  def grid(self) -> str:
    return f"Vault: {self.name}."

  def coordinates(self) -> str:
    return f"Buttons pressed: {len(self.entered)} of {len(self.code)}."

  def plan(self) -> list[str] | None:
    return (
      list(self.code[len(self.entered) :])
      if self.code[: len(self.entered)] == self.entered
      else None
    )


class VaultEnv(PuzzleEnv):
  task = TASK
  task_description = "Open the vault by entering its code."

  def make_game(self, seed: int) -> VaultGame:
    return VaultGame(seed, self.config)

  def instruction(self) -> str:
    c = self.config
    return (
      f"Open the vault: enter its code, {c.code_length} presses of the buttons "
      f"{', '.join(c.buttons)}, separated by ' {puzzles.ACTION_SEP} '."
    )

  def _observation(self, state: str) -> str:
    return state

  def used_variations(self, task: str, split: Split) -> list[int]:
    """The split's first N seeds, or with `distinct_codes` its first N seeds whose codes differ
    from every earlier one kept (a policy that answers one code then opens one vault at most)."""
    if not self.config.distinct_codes:
      return super().used_variations(task, split)
    self._check_task(task)
    n, c = self.config.num_variations(split), self.config
    out, codes = [], set()
    for s in puzzles.seeds(split):
      if len(out) == n:
        break
      code = tuple(vault_code(s, c.code_length, c.buttons))
      if code not in codes:
        out.append(s)
        codes.add(code)
    if len(out) < n:
      raise ValueError(
        f"the {split} split has {len(out)} vaults of distinct codes "
        f"({len(c.buttons)}**{c.code_length} codes), fewer than the {n} asked: ask for fewer "
        f"variations or set env.distinct_codes=False"
      )
    return out


@dataclasses.dataclass(frozen=True)
class VaultMaterial:
  task_description: str
  instruction: str


def materials(env: VaultEnv, task: str, variations: Sequence[int], n_few_shot: int) -> dict:
  """{(task, variation): VaultMaterial}; no examples (a solved vault teaches nothing about
  another: env.few_shot is ignored)."""
  del n_few_shot
  m = VaultMaterial(env.task_description, env.instruction())
  return {(task, int(v)): m for v in variations}


CLOSING = "Reply with the code only."


def first_user_message(material: VaultMaterial, observation: str, tips: Sequence[str] = ()) -> str:
  return f"{material.instruction}\n{observation.strip()}\n" + tip_block(tips) + CLOSING


def step_user_message(observation: str, tips: Sequence[str] = ()) -> str:
  return f"{observation.strip()}\n" + tip_block(tips) + CLOSING


PROMPTS = PromptSet(first_user_message, step_user_message, score_out_of=None)
FIELDS = ("code_length", "buttons", "partial_score", "distinct_codes")


def env_config(c) -> VaultConfig:
  kw = puzzle_suite.env_fields(c, *puzzle_suite.COMMON_FIELDS, *FIELDS)
  if c.env.max_steps:
    kw["max_turns"] = c.env.max_steps
  return VaultConfig(**kw)


SUITE = registry.register(
  registry.EnvSuite(
    name=TASK,
    tasks=(TASK,),
    env_config=env_config,
    worker=lambda cfg: puzzle_suite.PuzzleWorkers(VaultEnv, cfg, name=TASK),
    local_env=VaultEnv,
    materials=materials,
    prompts=PROMPTS,
    check_config=env_config,
  )
)
