"""FrozenLake (gymnasium's FrozenLakeEnv) as RAGEN/SPA run it (docs/methods.md §7.5), a puzzle
TextEnv.

The dynamics are gymnasium's own `FrozenLakeEnv(desc=map, is_slippery=...)`, reset with the
variation's seed (so a slippery episode, and its replay after a worker crash, draws the same
slips). Maps (FrozenLakeConfig.map_generator):
  "ragen"      (default, SPA's) 4x4, each tile frozen with probability p = 0.8, start and goal on
               random distinct tiles, drawn again until the goal can be reached; our code of the
               procedure RAGEN's generate_random_map follows, with the same draws from gymnasium's
               seeding.np_random(seed), so a seed gives RAGEN's map
  "gymnasium"  gymnasium's generate_random_map(size, p, seed): start top left, goal bottom right
Slippery (default, as SPA): the intended move with probability 1/3, each perpendicular one with
1/3 (gymnasium's); slippery=False is the deterministic option.

Text (RAGEN's symbols): P player, _ frozen, O hole, G goal, X player in a hole, √ player on the
goal; the start tile shows as frozen. Actions: Left, Down, Right, Up (gymnasium's 0..3). Reward 1
on reaching the goal, else 0; the episode ends in a hole or on the goal; success = on the goal.
The coordinates line of render="text_with_coordinates" ("Player (P) is at (r,c); goal (G) is at
(r,c); holes (O) are at (r,c), ...", zero-indexed (row, col)) is our proposal: RAGEN's render
function for it was not found (docs/methods.md §7.5).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from gymnasium.envs.toy_text import frozen_lake as gym_frozen_lake
from gymnasium.utils import seeding

from empo2_jax.envs import puzzle_suite, puzzles
from empo2_jax.envs.puzzles import Game, PuzzleConfig, PuzzleEnv

TASK = "frozenlake"
ACTIONS = ("Left", "Down", "Right", "Up")  # gymnasium's action ids 0..3 (RAGEN's 1..4)
MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
MAP_GENERATORS = ("ragen", "gymnasium")
SYMBOLS = {"player": "P", "frozen": "_", "hole": "O", "goal": "G", "in_hole": "X", "on_goal": "√"}


@dataclasses.dataclass(frozen=True)
class FrozenLakeConfig(PuzzleConfig):
  size: int = 4
  p: float = 0.8  # probability that a tile is frozen
  slippery: bool = True
  map_generator: str = "ragen"

  def __post_init__(self):
    super().__post_init__()
    if self.map_generator not in MAP_GENERATORS:
      raise ValueError(f"map_generator={self.map_generator!r}; valid: {', '.join(MAP_GENERATORS)}")
    if self.size < 2 or not 0.0 < self.p <= 1.0:
      raise ValueError(f"FrozenLake needs size >= 2 and 0 < p <= 1, got {self.size}, {self.p}")


def _reachable(board: np.ndarray) -> bool:
  """Whether G can be reached from S without stepping on H (4-neighbour search)."""
  n = board.shape[0]
  start = tuple(int(x) for x in np.argwhere(board == "S")[0])
  seen, todo = {start}, [start]
  while todo:
    r, c = todo.pop()
    for dr, dc in MOVES.values():
      rr, cc = r + dr, c + dc
      if 0 <= rr < n and 0 <= cc < n and (rr, cc) not in seen and board[rr, cc] != "H":
        if board[rr, cc] == "G":
          return True
        seen.add((rr, cc))
        todo.append((rr, cc))
  return False


def generate_map(size: int = 4, p: float = 0.8, seed: int | None = None, generator="ragen"):
  """The map of `seed` as gymnasium's desc rows ("SFFH", ...); see the module docstring."""
  if generator == "gymnasium":
    return gym_frozen_lake.generate_random_map(size=size, p=p, seed=seed)
  if generator != "ragen":
    raise ValueError(f"generator={generator!r}; valid: {', '.join(MAP_GENERATORS)}")
  rng, _ = seeding.np_random(seed)
  while True:
    board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p])
    start = tuple(int(x) for x in rng.integers(size, size=2))
    goal = tuple(int(x) for x in rng.integers(size, size=2))
    if start == goal:
      continue
    board[start], board[goal] = "S", "G"
    if _reachable(board):
      return ["".join(row) for row in board]


class FrozenLakeGame(Game):
  actions = ACTIONS

  def __init__(self, desc: list[str], slippery: bool, seed: int):
    self.env = gym_frozen_lake.FrozenLakeEnv(desc=desc, is_slippery=slippery)
    self.env.reset(seed=seed)
    self.desc = self.env.desc  # bytes array, as gymnasium keeps it
    self.nrow, self.ncol = self.desc.shape

  @property
  def position(self) -> tuple[int, int]:
    return divmod(int(self.env.s), self.ncol)

  def step(self, action: int) -> tuple[float, bool]:
    _, reward, terminated, _, _ = self.env.step(action)
    return float(reward), bool(terminated)

  @property
  def success(self) -> bool:
    return self.desc[self.position] == b"G"

  def grid(self) -> str:
    tile = {b"S": "frozen", b"F": "frozen", b"H": "hole", b"G": "goal"}
    rows = [[SYMBOLS[tile[bytes(x)]] for x in row] for row in self.desc]
    r, c = self.position
    here = bytes(self.desc[r, c])
    rows[r][c] = SYMBOLS["in_hole" if here == b"H" else "on_goal" if here == b"G" else "player"]
    return "\n".join("".join(row) for row in rows)

  def coordinates(self) -> str:
    goal = [tuple(int(x) for x in rc) for rc in np.argwhere(self.desc == b"G")]
    holes = [tuple(int(x) for x in rc) for rc in np.argwhere(self.desc == b"H")]
    at = ", ".join(f"({r},{c})" for r, c in holes) or "none"
    r, c = self.position
    return (
      f"Player (P) is at ({r},{c}); goal (G) is at ({goal[0][0]},{goal[0][1]}); "
      f"holes (O) are at {at}."
    )

  def plan(self) -> list[str] | None:
    def moves(pos):
      for a, word in enumerate(ACTIONS):
        dr, dc = MOVES[a]
        nxt = (min(max(pos[0] + dr, 0), self.nrow - 1), min(max(pos[1] + dc, 0), self.ncol - 1))
        if self.desc[nxt] != b"H":
          yield word, nxt

    return puzzles.bfs_plan(self.position, moves, lambda pos: self.desc[pos] == b"G")


class FrozenLakeEnv(PuzzleEnv):
  task = TASK
  task_description = "Walk from your position to the goal (G) without falling into a hole (O)."

  def make_game(self, seed: int) -> FrozenLakeGame:
    c = self.config
    desc = generate_map(c.size, c.p, seed, c.map_generator)
    return FrozenLakeGame(desc, c.slippery, seed)

  def instruction(self) -> str:
    c = self.config
    n = c.size - 1
    lines = [
      "You are solving the FrozenLake puzzle. Walk on the frozen lake from your position to "
      "the goal without stepping into a hole; stepping into a hole ends the game.",
      "Symbols: P you, _ frozen ice, O hole, G goal, X you in a hole, √ you on the goal.",
      "Actions: Left, Down, Right, Up (a move into the edge of the lake leaves you in place).",
    ]
    if c.slippery:
      lines.append(
        "The ice is slippery: a move can take you in one of the two directions at right "
        "angles to the one you chose."
      )
    if c.render == "text_with_coordinates":
      lines.append(f"Coordinates are (row, column), from (0,0) at the top left to ({n},{n}).")
    lines.append(
      f"Each turn you may give up to {c.max_actions_per_turn} actions separated by "
      f"' {puzzles.ACTION_SEP} ', for example: Left {puzzles.ACTION_SEP} Up. You have "
      f"{c.max_actions} actions in all. Reward: 1 for reaching the goal."
    )
    return "\n".join(lines)


SUITE = puzzle_suite.register_suite(
  FrozenLakeEnv, FrozenLakeConfig, "size", "p", "slippery", "map_generator"
)
env_config = SUITE.env_config
