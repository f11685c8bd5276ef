"""Sokoban as RAGEN/SPA run it (SimpleSokoban: 6x6, one box; docs/methods.md §7.5), a puzzle
TextEnv.

Room generation is our own port of gym-sokoban's `generate_room` as RAGEN uses it, not the
package: gym-sokoban 0.0.6 (its last PyPI release, 2019) needs the unmaintained `gym` 0.26, which
does not support NumPy 2 (this project pins numpy 2.4), and its generate_room has no
search_depth. The procedure (facts of gym-sokoban/RAGEN, our code):
  1. topology: a random walk of `num_gen_steps` (int(1.7 * (rows + cols)) = 20 for 6x6) steps that
     changes direction with probability 0.35 and stamps one of five 3x3 floor masks around each
     position; the border stays wall;
  2. the player and then each box target go on random floor tiles (every box starts on its
     target);
  3. reverse play: a depth-first search (depth `search_depth`, RAGEN's 300) over PULL moves from
     that solved state; each state scores (number of box switches) x (summed Manhattan distance of
     the boxes from their targets), 0 while a target is covered; the best-scoring state is the
     room, so it is solvable by pushing the pulls back;
  4. tries 4 topologies for a score > 0, then, as RAGEN adds, moves the player 1-3 random steps
     (with probability 0.8 when the box is one tile from its target, else 0.5; each further step
     with probability 0.5; never back onto a tile it left).
One seeded numpy Generator draws everything (gym-sokoban uses the global `random` and `np.random`;
a failed seed is redrawn from the same Generator rather than RAGEN's hash of the seed string), so
maps are reproducible but not RAGEN's maps for the same seed.

Dynamics and rewards are gym-sokoban's: Up/Down/Left/Right move the player onto a free tile or
push an adjacent box one tile if the tile behind it is free (no pulling, no pushing through walls
or other boxes); -0.1 every action, +1 when a box goes onto a target, -1 when one leaves it, +10
when every box is on a target (success, the episode ends); the game also ends after `max_steps`
(100) actions. Text (RAGEN's symbols): # wall, _ floor, O target, X box, √ box on target, P player,
S player on a target. render="text_with_coordinates" adds "Player (P) is at (r,c); box (X) is at
(r,c); target (O) is at (r,c)." (zero-indexed (row, col); the format inferred from SPA's examples,
docs/methods.md §7.5).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from empo2_jax.envs import puzzle_suite, puzzles
from empo2_jax.envs.puzzles import Game, PuzzleConfig, PuzzleEnv

TASK = "sokoban"
ACTIONS = ("Up", "Down", "Left", "Right")  # gym-sokoban's push actions 1..4 (RAGEN's ids)
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
# The five 3x3 floor stamps of the topology walk (gym-sokoban's masks).
_MASKS = (
  ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
  ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
  ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
  ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
  ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
STEP_PENALTY, BOX_ON, BOX_OFF, SOLVED = -0.1, 1.0, -1.0, 10.0


@dataclasses.dataclass(frozen=True)
class SokobanConfig(PuzzleConfig):
  dim: tuple[int, int] = (6, 6)
  num_boxes: int = 1
  search_depth: int = 300  # reverse-play depth (RAGEN's SokobanEnvConfig default)
  num_gen_steps: int = 0  # topology walk length; 0: int(1.7 * (rows + cols))
  max_env_steps: int = 100  # gym-sokoban's max_steps

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "dim", tuple(int(x) for x in self.dim))
    if min(self.dim) < 4 or self.num_boxes < 1 or self.search_depth < 1:
      raise ValueError(
        f"Sokoban needs dim >= 4x4, num_boxes >= 1 and search_depth >= 1, got {self.dim}, "
        f"{self.num_boxes}, {self.search_depth}"
      )

  @property
  def gen_steps(self) -> int:
    return self.num_gen_steps or int(1.7 * (self.dim[0] + self.dim[1]))


@dataclasses.dataclass(frozen=True)
class Room:
  """A generated room: walls (True = wall), targets, box positions and the player."""

  walls: np.ndarray
  targets: frozenset
  boxes: frozenset
  player: tuple[int, int]


# ----------------------------------------------------------------------------- generation
def _topology(rng: np.random.Generator, dim, steps: int) -> np.ndarray:
  """Floor (True) / wall (False) grid from the mask-stamping random walk."""
  rows, cols = dim
  floor = np.zeros(dim, dtype=bool)
  direction = MOVES[rng.integers(4)]
  pos = np.array([rng.integers(1, rows - 1), rng.integers(1, cols - 1)])
  for _ in range(steps):
    if rng.random() < 0.35:
      direction = MOVES[rng.integers(4)]
    pos = np.clip(pos + direction, [1, 1], [rows - 2, cols - 2])
    mask = np.array(_MASKS[rng.integers(len(_MASKS))], dtype=bool)
    floor[pos[0] - 1 : pos[0] + 2, pos[1] - 1 : pos[1] + 2] |= mask
  floor[[0, -1], :] = False
  floor[:, [0, -1]] = False
  return floor


def _reverse_play(floor: np.ndarray, targets: tuple, player: tuple, depth: int):
  """Best (score, boxes, player) reachable from the solved state by moves and pulls (see the
  module docstring); boxes as a tuple in target order, so each box keeps its target."""
  best = [0, tuple(targets), player]
  seen = set()
  goal = set(targets)

  def score(boxes, player, swaps):
    if player in goal or any(b in goal for b in boxes):  # a covered target scores 0 (gym-sokoban)
      return 0
    dist = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
    return swaps * dist

  def search(boxes, player, swaps, last, ttl):
    ttl -= 1
    if ttl <= 0 or len(seen) >= 300_000:
      return
    key = (boxes, player)
    if key in seen:
      return
    seen.add(key)
    s = score(boxes, player, swaps)
    if s > best[0]:
      best[:] = [s, boxes, player]
    for dr, dc in MOVES:
      nxt = (player[0] + dr, player[1] + dc)
      if not floor[nxt] or nxt in boxes:
        continue
      behind = (player[0] - dr, player[1] - dc)
      new_boxes, new_last = boxes, last
      if behind in boxes:  # pull the box behind the player onto the player's tile
        i = boxes.index(behind)
        new_boxes = boxes[:i] + (player,) + boxes[i + 1 :]
        new_last = i
      search(new_boxes, nxt, swaps + (new_last != last), new_last, ttl)

  search(tuple(targets), player, 0, -1, depth)
  return best


def _walk_player(rng, floor, boxes, player, p_move: float):
  """RAGEN's extra 1-3 random player steps after reverse play."""
  if rng.random() > p_move:
    return player
  visited = [player]
  for _ in range(3):
    options = []
    for dr, dc in MOVES:
      nxt = (player[0] + dr, player[1] + dc)
      if floor[nxt] and nxt not in boxes and nxt not in visited:
        options.append(nxt)
    if not options:
      break
    player = options[rng.integers(len(options))]
    visited.append(player)
    if len(visited) > 3 or rng.random() > 0.5:
      break
  return player


def generate_room(seed: int, config: SokobanConfig = SokobanConfig(), tries: int = 4) -> Room:
  """The room of `seed` (module docstring). Deterministic in (seed, config)."""
  rng = np.random.default_rng(seed)
  n = config.num_boxes
  while True:  # a seed whose tries all fail is redrawn from the same Generator
    for _ in range(tries):
      floor = _topology(rng, config.dim, config.gen_steps)
      cells = [tuple(int(x) for x in rc) for rc in np.argwhere(floor)]
      if len(cells) <= n + 1:
        continue
      player = cells[rng.integers(len(cells))]
      free = [x for x in cells if x != player]
      targets = tuple(free[i] for i in rng.choice(len(free), size=n, replace=False))
      score, boxes, player = _reverse_play(floor, targets, player, config.search_depth)
      if score > 0:
        dist = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
        player = _walk_player(rng, floor, set(boxes), player, 0.8 if dist == 1 else 0.5)
        return Room(~floor, frozenset(targets), frozenset(boxes), player)


# ----------------------------------------------------------------------------- dynamics
def move(walls, boxes: frozenset, player, action: int):
  """(boxes, player) after action `action` (gym-sokoban's push-or-move); unchanged if blocked."""
  dr, dc = MOVES[action]
  nxt = (player[0] + dr, player[1] + dc)
  if walls[nxt]:
    return boxes, player
  if nxt in boxes:
    beyond = (nxt[0] + dr, nxt[1] + dc)
    if walls[beyond] or beyond in boxes:
      return boxes, player
    return (boxes - {nxt}) | {beyond}, nxt
  return boxes, nxt


class SokobanGame(Game):
  actions = ACTIONS

  def __init__(self, room: Room, max_env_steps: int = 100):
    self.walls, self.targets = room.walls, room.targets
    self.boxes, self.player = room.boxes, room.player
    self.max_env_steps = max_env_steps
    self.env_steps = 0

  def on_target(self) -> int:
    return len(self.boxes & self.targets)

  def step(self, action: int) -> tuple[float, bool]:
    before = self.on_target()
    self.boxes, self.player = move(self.walls, self.boxes, self.player, action)
    self.env_steps += 1
    after = self.on_target()
    reward = STEP_PENALTY + (BOX_ON if after > before else BOX_OFF if after < before else 0.0)
    if self.success:
      reward += SOLVED
    return reward, self.success or self.env_steps >= self.max_env_steps

  @property
  def success(self) -> bool:
    return self.boxes <= self.targets

  def grid(self) -> str:
    rows = []
    for r in range(self.walls.shape[0]):
      row = []
      for c in range(self.walls.shape[1]):
        pos, target = (r, c), (r, c) in self.targets
        if self.walls[pos]:
          row.append("#")
        elif pos == self.player:
          row.append("S" if target else "P")
        elif pos in self.boxes:
          row.append("√" if target else "X")
        else:
          row.append("O" if target else "_")
      rows.append("".join(row))
    return "\n".join(rows)

  def coordinates(self) -> str:
    def at(cells):
      return ", ".join(f"({r},{c})" for r, c in sorted(cells))

    many = len(self.boxes) > 1
    box = "boxes (X) are" if many else "box (X) is"
    target = "targets (O) are" if many else "target (O) is"
    r, c = self.player
    return f"Player (P) is at ({r},{c}); {box} at {at(self.boxes)}; {target} at {at(self.targets)}."

  def plan(self) -> list[str] | None:
    def moves(state):
      boxes, player = state
      for a, word in enumerate(ACTIONS):
        nxt = move(self.walls, boxes, player, a)
        if nxt != state:
          yield word, nxt

    return puzzles.bfs_plan(
      (self.boxes, self.player), moves, lambda s: s[0] <= self.targets, max_depth=200
    )


class SokobanEnv(PuzzleEnv):
  task = TASK
  task_description = "Push every box (X) onto a target (O)."

  def make_game(self, seed: int) -> SokobanGame:
    return SokobanGame(generate_room(seed, self.config), self.config.max_env_steps)

  def instruction(self) -> str:
    c = self.config
    lines = [
      "You are solving the Sokoban puzzle: you are the player and must push every box onto a "
      "target. Walk next to a box and move towards it to push it one tile; you cannot pull a "
      "box, push it into a wall or push two boxes at once.",
      "Symbols: # wall, _ floor, O target, X box, √ box on a target, P you, S you on a target.",
      "Actions: Up, Down, Left, Right.",
    ]
    if c.render == "text_with_coordinates":
      r, k = c.dim[0] - 1, c.dim[1] - 1
      lines.append(f"Coordinates are (row, column), from (0,0) at the top left to ({r},{k}).")
    lines.append(
      f"Each turn you may give up to {c.max_actions_per_turn} actions separated by "
      f"' {puzzles.ACTION_SEP} ', for example: Right {puzzles.ACTION_SEP} Up. You have "
      f"{c.max_actions} actions in all. Rewards: -0.1 per action, +1 for a box onto a target, "
      "-1 for a box off a target, +10 when all boxes are on targets."
    )
    return "\n".join(lines)


SUITE = puzzle_suite.register_suite(
  SokobanEnv, SokobanConfig, "dim", "num_boxes", "search_depth", "num_gen_steps", "max_env_steps"
)
env_config = SUITE.env_config
