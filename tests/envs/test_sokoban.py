"""Sokoban: the room generator's invariants (one box, one target, reachable, solvable), dynamics
and rewards against hand-computed cases, renderings parsed back to the state, gold plans, splits
and the pool."""

import collections

import numpy as np
import pytest

from empo2_jax.envs import puzzles, registry
from empo2_jax.envs import sokoban as sk
from empo2_jax.envs.pool import EnvPool, PoolConfig

BIG = sk.SokobanConfig(max_actions=100, max_turns=100, max_actions_per_turn=100)
DELTA = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def parse(grid: str):
  """(walls, boxes, targets, player) read back from a rendered grid."""
  walls, boxes, targets, player = set(), set(), set(), []
  for r, row in enumerate(grid.split("\n")):
    for c, ch in enumerate(row):
      if ch == "#":
        walls.add((r, c))
      if ch in "X√":
        boxes.add((r, c))
      if ch in "O√S":
        targets.add((r, c))
      if ch in "PS":
        player.append((r, c))
  assert len(player) == 1
  return walls, boxes, targets, player[0]


def reachable(walls, boxes, start):
  seen, todo = {start}, collections.deque([start])
  while todo:
    r, c = todo.popleft()
    for dr, dc in DELTA.values():
      n = (r + dr, c + dc)
      if n not in walls and n not in boxes and n not in seen:
        seen.add(n)
        todo.append(n)
  return seen


def test_generator_invariants():
  lengths = []
  for seed in range(80):
    room = sk.generate_room(seed)
    again = sk.generate_room(seed)
    assert np.array_equal(room.walls, again.walls) and room == sk.Room(
      room.walls, again.targets, again.boxes, again.player
    )
    assert room.walls.shape == (6, 6)
    assert room.walls[0].all() and room.walls[-1].all()
    assert room.walls[:, 0].all() and room.walls[:, -1].all()
    assert len(room.boxes) == 1 and len(room.targets) == 1 and not room.boxes & room.targets
    (box,), (target,) = room.boxes, room.targets
    assert not room.walls[box] and not room.walls[target] and not room.walls[room.player]
    assert room.player != box
    walls = {tuple(x) for x in np.argwhere(room.walls)}
    near = {(box[0] + dr, box[1] + dc) for dr, dc in DELTA.values()}
    assert near & reachable(walls, room.boxes, room.player)  # the player can reach the box
    plan = sk.SokobanGame(room).plan()
    assert plan, seed  # solvable (BFS over the push dynamics)
    lengths.append(len(plan))
  assert len({tuple(map(tuple, sk.generate_room(s).walls)) for s in range(80)}) > 40
  assert 1 <= min(lengths) and max(lengths) <= 20


def room(rows):
  """A Room from a text grid (RAGEN symbols)."""
  walls = np.array([[ch == "#" for ch in row] for row in rows])
  w, boxes, targets, player = parse("\n".join(rows))
  return sk.Room(walls, frozenset(targets), frozenset(boxes), player)


def test_dynamics_and_rewards_hand_computed():
  g = sk.SokobanGame(room(["######", "#P_XO#", "#____#", "######"]))
  assert g.grid() == "######\n#P_XO#\n#____#\n######"
  assert g.step(3) == (pytest.approx(-0.1), False)  # Right: walk
  assert g.player == (1, 2)
  reward, done = g.step(3)  # Right: push the box onto the target: -0.1 + 1 + 10
  assert reward == pytest.approx(10.9) and done and g.success
  assert g.grid() == "######\n#__P√#\n#____#\n######"
  g = sk.SokobanGame(room(["######", "#_P√_#", "#____#", "######"]))
  assert g.success  # the box starts on its target (a generated room never does)
  reward, done = g.step(3)  # push the box off its target: -0.1 - 1
  assert reward == pytest.approx(-1.1) and not done and not g.success
  assert g.grid() == "######\n#__SX#\n#____#\n######"  # S: player on the target
  reward, _ = g.step(3)  # box against the wall: nothing moves, still -0.1
  assert reward == pytest.approx(-0.1) and g.player == (1, 3)
  g = sk.SokobanGame(room(["#######", "#PXX_O#", "#_____#", "#######"]))
  g.step(3)  # two boxes in a row cannot be pushed
  assert g.player == (1, 1) and g.boxes == {(1, 2), (1, 3)}
  g.step(0)  # Up into the wall
  assert g.player == (1, 1)
  g = sk.SokobanGame(room(["####", "#PX#", "#O_#", "####"]), max_env_steps=3)
  assert [g.step(0)[1] for _ in range(3)] == [False, False, True]  # gym-sokoban's max_steps


def test_render_matches_state_over_random_play():
  rng = np.random.default_rng(1)
  env = sk.SokobanEnv(BIG)
  for seed in range(20):
    _, info = env.reset("sokoban", seed)
    game = env._game
    for _ in range(15):
      walls, boxes, targets, player = parse(game.grid())
      assert walls == {tuple(x) for x in np.argwhere(game.walls)}
      assert boxes == set(game.boxes) and targets == set(game.targets) and player == game.player
      before = (game.boxes, game.player)
      word = sk.ACTIONS[rng.integers(4)]
      r = env.step(word)
      # an independent move: walk, push, or stay
      dr, dc = DELTA[word]
      nxt = (before[1][0] + dr, before[1][1] + dc)
      if nxt in walls:
        assert game.player == before[1]
      elif nxt in before[0]:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        moved = beyond not in walls and beyond not in before[0]
        assert game.player == (nxt if moved else before[1])
        assert (beyond in game.boxes) == moved or beyond in before[0]
      else:
        assert game.player == nxt and game.boxes == before[0]
      assert r.info.state == game.grid()
      if r.done:
        break


def test_coordinates_render():
  env = sk.SokobanEnv(sk.SokobanConfig(render="text_with_coordinates"))
  obs, info = env.reset("sokoban", 3)
  grid, coords = info.state.rsplit("\n", 1)
  _, boxes, targets, player = parse(grid)
  (b,), (t,) = boxes, targets
  assert coords == (
    f"Player (P) is at ({player[0]},{player[1]}); box (X) is at ({b[0]},{b[1]}); "
    f"target (O) is at ({t[0]},{t[1]})."
  )
  assert obs == info.state + "\nActions remaining: 10."
  assert "Coordinates are (row, column), from (0,0) at the top left to (5,5)." in (
    env.instruction()
  )


def test_gold_plans_solve():
  env = sk.SokobanEnv(BIG)
  for seed in list(range(30)) + list(puzzles.seeds("test")[:10]):
    env.reset("sokoban", seed)
    plan = env.gold_plan("sokoban", seed)
    result = env.step(" || ".join(plan))
    assert result.done and result.info.success and not result.info.truncated
    expected = -0.1 * len(plan) + 1 + 10  # one box: it reaches the target once, at the end
    assert result.info.score == pytest.approx(expected)


def test_default_limits_and_splits():
  env = sk.SokobanEnv(sk.SokobanConfig())
  assert env.used_variations("sokoban", "train") == [0, 1, 2, 3, 4]
  assert not set(env.variations("sokoban", "train")) & set(env.variations("sokoban", "test"))
  env.reset("sokoban", 0)
  r = None
  for _ in range(5):
    r = env.step("Up || Down")
    if r.done:
      break
  assert r.done and r.info.moves == 10 and (r.info.truncated or r.info.success)
  with pytest.raises(ValueError, match="dim >= 4x4"):
    sk.SokobanConfig(dim=(3, 3))


def test_pool_runs_sokoban():
  suite = registry.get_suite("sokoban")
  cfg = sk.SokobanConfig()
  local = suite.local_env(cfg)
  seeds = [0, 1, 2]
  with EnvPool(suite.worker(cfg), PoolConfig(num_workers=1)) as pool:
    first = pool.reset([("sokoban", s) for s in seeds])
    got = pool.step([local.gold_actions("sokoban", s)[0] for s in seeds])
  for s, f, r in zip(seeds, first, got):
    assert f == local.reset("sokoban", s)
    assert r == local.step(local.gold_actions("sokoban", s)[0])
