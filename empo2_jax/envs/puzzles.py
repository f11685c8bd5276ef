"""Grid puzzles (FrozenLake, Sokoban) as TextEnvs, run as RAGEN/SPA run them (docs/methods.md §7.5).

One variation is one generated map: its seed. Train, dev and test variations are disjoint seed
ranges (TRAIN_SEEDS, DEV_SEEDS, TEST_SEEDS); the variations a run uses of a split are its first
`num_*_variations` seeds.

A turn is one model answer, which may hold several actions: "Left || Up" (RAGEN's separator).
`parse_actions` is tolerant: it reads the <answer>...</answer> part if there is one, else the whole
text, splits it at "||" (also "," ";" and line breaks) and takes every action word it finds, in any
case ("move left." -> Left). Up to `max_actions_per_turn` of them run, and at most `max_actions`
in the episode (RAGEN: 5 and 10; it ends then, truncated, unless solved). A turn with a piece that
names no action, or with no action at all, costs `format_penalty` (RAGEN's -0.1) on top of the
game's rewards; the actions it did name still run. The reward of a turn is the sum of its actions'
rewards (RAGEN's acc_reward) plus that penalty; StepInfo.score is the return so far.

The observation after reset and after each turn is the state text (`render`: "text", RAGEN's
symbol grid, or "text_with_coordinates", the grid plus a line with the (row, col) of the pieces),
then how many actions remain ("Actions remaining: 8."; not RAGEN's "You have 8 actions left",
since "left" is an action word and an echoed observation would move). After a turn that named no
action the observation starts with "Your answer named no action." StepInfo.state /
ResetInfo.state hold the bare state text (SPA's world-model targets).

Gold solutions: `gold_plan` is the shortest action sequence (breadth-first search) over the
deterministic dynamics of the variation's start state; for slippery FrozenLake it is the plan on
the same map without slipping, which the slippery episode may not follow. `gold_actions` cuts the
plan into turns of `max_actions_per_turn` actions. Few-shot examples replay gold turns of train
seeds and keep only episodes that end solved (envs/puzzle_suite.py: the pool's workers, the prompt
material and messages, the suite's registration).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable, Hashable, Iterable, Sequence

from empo2_jax.text import printable_text
from empo2_jax.envs.base import ResetInfo, ResetResult, Split, StepInfo, StepResult, check_split

# Disjoint seed ranges per split: (first seed, number of variations).
TRAIN_SEEDS = (0, 100_000)
DEV_SEEDS = (1_000_000, 10_000)
TEST_SEEDS = (2_000_000, 10_000)
RENDERS = ("text", "text_with_coordinates")
ACTION_SEP = "||"
_PIECE_SPLIT = re.compile(r"\|\||[,;\n]")
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S | re.I)


@dataclasses.dataclass(frozen=True)
class PuzzleConfig:
  """What FrozenLake and Sokoban share; defaults are RAGEN's/SPA's (docs/methods.md §7.4-7.5)."""

  render: str = "text"  # "text" or "text_with_coordinates" (SPA's)
  max_turns: int = 5  # model answers per episode
  max_actions_per_turn: int = 5
  max_actions: int = 10  # actions per episode (RAGEN: max_actions_per_traj)
  format_penalty: float = -0.1  # per turn with an unreadable piece or no action
  num_train_variations: int = 5
  num_dev_variations: int = 20
  num_test_variations: int = 20

  def __post_init__(self):
    if self.render not in RENDERS:
      raise ValueError(f"render={self.render!r}; valid: {', '.join(RENDERS)}")
    for name in ("max_turns", "max_actions_per_turn", "max_actions"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    for split, (_, count) in zip(("train", "dev", "test"), (TRAIN_SEEDS, DEV_SEEDS, TEST_SEEDS)):
      n = self.num_variations(split)
      if not 0 <= n <= count:
        raise ValueError(f"num_{split}_variations={n} must be in 0..{count}")

  def num_variations(self, split: Split) -> int:
    check_split(split)
    return {
      "train": self.num_train_variations,
      "dev": self.num_dev_variations,
      "test": self.num_test_variations,
    }[split]

  def max_steps(self, task: str) -> int:
    del task
    return self.max_turns


def seeds(split: Split) -> range:
  check_split(split)
  first, count = {"train": TRAIN_SEEDS, "dev": DEV_SEEDS, "test": TEST_SEEDS}[split]
  return range(first, first + count)


def parse_actions(text: str, words: Sequence[str]) -> tuple[list[str], bool]:
  """(the action words in `text`, in order and spelled as in `words`; whether every piece named
  one). See the module docstring."""
  text = printable_text(text)
  m = _ANSWER.search(text)
  content = m.group(1) if m else text
  pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", re.I)
  canonical = {w.lower(): w for w in words}
  found, valid = [], True
  for piece in _PIECE_SPLIT.split(content):
    if not piece.strip():
      continue
    hits = [canonical[h.lower()] for h in pattern.findall(piece)]
    valid &= bool(hits)
    found += hits
  return found, valid and bool(found)


def bfs_plan(
  start: Hashable,
  moves: Callable[[Hashable], Iterable[tuple[str, Hashable]]],
  is_goal: Callable[[Hashable], bool],
  max_depth: int = 100,
) -> list[str] | None:
  """The shortest list of action words from `start` to a goal state (breadth-first; `moves(s)`
  yields (word, next state) in a fixed order, so ties go to the earlier word), or None."""
  if is_goal(start):
    return []
  parent = {start: None}
  frontier = collections.deque([(start, 0)])
  while frontier:
    state, depth = frontier.popleft()
    if depth >= max_depth:
      continue
    for word, nxt in moves(state):
      if nxt in parent:
        continue
      parent[nxt] = (state, word)
      if is_goal(nxt):
        plan = []
        while parent[nxt] is not None:
          nxt, w = parent[nxt]
          plan.append(w)
        return plan[::-1]
      frontier.append((nxt, depth + 1))
  return None


class Game:
  """One episode's puzzle state; subclasses implement the dynamics (see frozenlake/sokoban)."""

  actions: tuple[str, ...] = ()  # action words, in the order `step` numbers them

  def step(self, action: int) -> tuple[float, bool]:
    """Applies action `action` (an index into `actions`): (reward, terminal)."""
    raise NotImplementedError

  @property
  def success(self) -> bool:
    raise NotImplementedError

  def grid(self) -> str:
    raise NotImplementedError

  def coordinates(self) -> str:
    raise NotImplementedError

  def plan(self) -> list[str] | None:
    """Shortest solution from the current state over the deterministic dynamics."""
    raise NotImplementedError


class PuzzleEnv:
  """A TextEnv over one puzzle (`task`); subclasses set `task`, `make_game` and the texts."""

  task: str = ""
  task_description: str = ""

  def __init__(self, config: PuzzleConfig):
    self.config = config
    self._game: Game | None = None
    self._variation = -1
    self._turns = self._actions = 0
    self._score = 0.0
    self._done = False

  # ------------------------------------------------------------------- subclass hooks
  def make_game(self, seed: int) -> Game:
    raise NotImplementedError

  def instruction(self) -> str:
    """The rules, symbols and action words for the first prompt."""
    raise NotImplementedError

  # ------------------------------------------------------------------- tasks and splits
  @property
  def tasks(self) -> tuple[str, ...]:
    return (self.task,)

  def variations(self, task: str, split: Split) -> list[int]:
    self._check_task(task)
    return list(seeds(split))

  def used_variations(self, task: str, split: Split) -> list[int]:
    self._check_task(task)
    return list(seeds(split)[: self.config.num_variations(split)])

  def gold_plan(self, task: str, variation: int) -> list[str]:
    self._check_variation(task, variation)
    plan = self.make_game(int(variation)).plan()
    if plan is None:
      raise RuntimeError(f"{task} variation {variation} has no solution (generator bug)")
    return plan

  def gold_actions(self, task: str, variation: int) -> list[str]:
    """The gold plan cut into turns of at most max_actions_per_turn actions ("Left || Up")."""
    plan, k = self.gold_plan(task, variation), self.config.max_actions_per_turn
    return [f" {ACTION_SEP} ".join(plan[i : i + k]) for i in range(0, len(plan), k)]

  # ------------------------------------------------------------------- episode
  def reset(self, task: str, variation: int) -> ResetResult:
    self._check_variation(task, variation)
    self._variation = int(variation)
    self._game = self.make_game(self._variation)
    self._turns = self._actions = 0
    self._score = 0.0
    self._done = False
    state = self.state_text()
    info = ResetInfo(
      task=self.task,
      variation=self._variation,
      task_description=self.task_description,
      max_steps=self.config.max_turns,
      state=state,
    )
    return ResetResult(self._observation(state), info)

  def step(self, action_text: str) -> StepResult:
    if self._game is None:
      raise RuntimeError(f"{type(self).__name__}.step called before reset(task, variation).")
    if self._done:
      raise RuntimeError(
        f"The episode ({self.task}, variation {self._variation}) is over; call reset first."
      )
    c, game = self.config, self._game
    words, valid = parse_actions(action_text, game.actions)
    budget = min(c.max_actions_per_turn, c.max_actions - self._actions)
    reward, terminal, executed = 0.0, False, []
    for word in words[:budget]:
      r, terminal = game.step(game.actions.index(word))
      reward += float(r)
      executed.append(word)
      if terminal:
        break
    if not valid:
      reward += c.format_penalty
    self._turns += 1
    self._actions += len(executed)
    self._score += reward
    limit = self._actions >= c.max_actions or self._turns >= c.max_turns
    self._done = terminal or limit
    state = self.state_text()
    # Feedback without the action words: a model that echoes it must not act by accident.
    note = "" if words else "Your answer named no action.\n"
    info = StepInfo(
      score=self._score,
      valid=valid,
      raw_action=action_text,
      executed_action=f" {ACTION_SEP} ".join(executed),
      moves=self._actions,
      steps=self._turns,
      truncated=self._done and not terminal,
      success=bool(game.success),
      state=state,
    )
    return StepResult(note + self._observation(state), reward, self._done, info)

  def state_text(self) -> str:
    game = self._game
    if self.config.render == "text_with_coordinates":
      return game.grid() + "\n" + game.coordinates()
    return game.grid()

  def _observation(self, state: str) -> str:
    n = self.config.max_actions - self._actions
    return f"{state}\nActions remaining: {n}."

  def close(self) -> None:
    self._game = None

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _check_task(self, task: str) -> None:
    if task != self.task:
      raise ValueError(f"Unknown task {task!r}. Valid tasks: {self.task}.")

  def _check_variation(self, task: str, variation: int) -> None:
    self._check_task(task)
    v = int(variation)
    if not any(v in seeds(s) for s in ("train", "dev", "test")):
      raise ValueError(
        f"Variation {variation!r} of {task!r} is in no split; seeds: train {TRAIN_SEEDS}, "
        f"dev {DEV_SEEDS}, test {TEST_SEEDS} as (first, count)."
      )
