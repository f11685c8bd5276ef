"""FrozenLake: maps, renderings and transitions against gymnasium's own state, gold plans, action
parsing, limits and penalties, disjoint splits, prompt material and the pool."""

import numpy as np
import pytest
from gymnasium.envs.toy_text import frozen_lake as gym_fl

from empo2_jax.envs import frozenlake as fl
from empo2_jax.envs import puzzles, registry
from empo2_jax.envs.pool import EnvPool, PoolConfig
from empo2_jax.tips import strip_tips

DET = fl.FrozenLakeConfig(slippery=False, max_actions=100, max_turns=100)
SLIP = fl.FrozenLakeConfig(slippery=True, max_actions=100, max_turns=100)
DELTA = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def reach(rows, start, goal):
  """Independent reachability check: flood fill over non-hole tiles."""
  seen, todo = {start}, [start]
  while todo:
    r, c = todo.pop()
    for dr, dc in DELTA.values():
      n = (r + dr, c + dc)
      if (
        0 <= n[0] < len(rows)
        and 0 <= n[1] < len(rows)
        and n not in seen
        and rows[n[0]][n[1]] != "H"
      ):
        seen.add(n)
        todo.append(n)
  return goal in seen


def find(rows, ch):
  return [(r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x == ch]


def check_render(grid: str, game: fl.FrozenLakeGame):
  """The rendered grid against gymnasium's desc and s (env.unwrapped)."""
  unwrapped = game.env.unwrapped
  desc = [bytes(x).decode() for row in unwrapped.desc for x in row]
  pos = divmod(int(unwrapped.s), unwrapped.ncol)
  cells = grid.split("\n")
  assert len(cells) == unwrapped.nrow and all(len(r) == unwrapped.ncol for r in cells)
  for i, ch in enumerate("".join(cells)):
    rc, tile = divmod(i, unwrapped.ncol), desc[i]
    if rc == pos:
      assert ch == {"H": "X", "G": "√"}.get(tile, "P")
    else:
      assert ch == {"H": "O", "G": "G", "F": "_", "S": "_"}[tile]


def test_maps():
  for seed in range(60):
    rows = fl.generate_map(seed=seed)
    assert len(rows) == 4 and all(len(r) == 4 and set(r) <= set("SFHG") for r in rows)
    (s,), (g,) = find(rows, "S"), find(rows, "G")
    assert s != g and reach(rows, s, g)
    assert fl.generate_map(seed=seed) == rows  # deterministic
  assert len({tuple(fl.generate_map(seed=s)) for s in range(60)}) > 50
  # start and goal move around (RAGEN's maps), unlike gymnasium's fixed corners
  assert len({find(fl.generate_map(seed=s), "S")[0] for s in range(60)}) > 5
  for seed in range(5):
    assert fl.generate_map(seed=seed, generator="gymnasium") == gym_fl.generate_random_map(
      size=4, p=0.8, seed=seed
    )
  with pytest.raises(ValueError, match="ragen, gymnasium"):
    fl.FrozenLakeConfig(map_generator="random")


@pytest.mark.parametrize("config", [DET, SLIP], ids=["deterministic", "slippery"])
def test_transitions_and_renderings_match_gymnasium(config):
  rng = np.random.default_rng(0)
  env = fl.FrozenLakeEnv(config)
  for seed in range(30):
    obs, info = env.reset("frozenlake", seed)
    game = env._game
    check_render(info.state, game)
    assert obs.startswith(info.state) and obs.endswith("Actions remaining: 100.")
    rows = [bytes(x).decode() for x in [b"".join(r) for r in game.env.unwrapped.desc]]
    for _ in range(12):
      word = fl.ACTIONS[rng.integers(4)]
      before = game.position
      obs, reward, done, step = env.step(word)
      check_render(step.state, game)
      pos = divmod(int(game.env.unwrapped.s), 4)
      tile = rows[pos[0]][pos[1]]
      if not config.slippery:  # the hand-computed move, clamped at the edge
        dr, dc = DELTA[word]
        assert pos == (min(max(before[0] + dr, 0), 3), min(max(before[1] + dc, 0), 3))
      assert reward == (1.0 if tile == "G" else 0.0)
      assert done == (tile in "HG") and step.success == (tile == "G")
      assert step.executed_action == word and step.valid
      if done:
        break


def test_slippery_replays_exactly_and_slips():
  env = fl.FrozenLakeEnv(SLIP)
  moves = ["Right", "Down", "Right", "Down", "Left", "Up"] * 2
  slipped = 0
  for seed in range(20):
    runs = []
    for _ in range(2):
      env.reset("frozenlake", seed)
      states = []
      for m in moves:
        r = env.step(m)
        states.append(r.info.state)
        if r.done:
          break
      runs.append(states)
    assert runs[0] == runs[1]  # the seed fixes the slips: a worker's replay sees the same
    det = fl.FrozenLakeEnv(DET)
    det.reset("frozenlake", seed)
    slipped += det.step(moves[0]).info.state != runs[0][0]
  assert slipped >= 5  # about 2/3 of first moves slip


def test_gold_plans():
  env = fl.FrozenLakeEnv(DET)
  for seed in list(range(40)) + list(puzzles.seeds("test")[:10]):
    plan = env.gold_plan("frozenlake", seed)
    rows = fl.generate_map(seed=seed)
    (s,), (g,) = find(rows, "S"), find(rows, "G")
    assert len(plan) >= abs(s[0] - g[0]) + abs(s[1] - g[1])  # never shorter than Manhattan
    env.reset("frozenlake", seed)
    for turn in env.gold_actions("frozenlake", seed):
      assert len(turn.split(" || ")) <= DET.max_actions_per_turn
      result = env.step(turn)
    assert result.done and result.info.success and result.info.score == 1.0
  # slippery: the plan is the deterministic map's (it may fail to carry over)
  assert fl.FrozenLakeEnv(SLIP).gold_plan("frozenlake", 3) == env.gold_plan("frozenlake", 3)


def test_parse_actions():
  words = fl.ACTIONS
  assert puzzles.parse_actions("Left || Up", words) == (["Left", "Up"], True)
  assert puzzles.parse_actions("<think>go</think><answer>left||DOWN</answer>", words) == (
    ["Left", "Down"],
    True,
  )
  assert puzzles.parse_actions("move right.", words) == (["Right"], True)
  assert puzzles.parse_actions("Up, Up; Left", words) == (["Up", "Up", "Left"], True)
  assert puzzles.parse_actions("Left || jump", words) == (["Left"], False)
  assert puzzles.parse_actions("I think so", words) == ([], False)
  assert puzzles.parse_actions("", words) == ([], False)
  assert puzzles.parse_actions("Leftover \ud800", words) == ([], False)  # whole words only


def test_limits_penalty_and_truncation():
  env = fl.FrozenLakeEnv(fl.FrozenLakeConfig(slippery=False))  # RAGEN: 5 turns, 5/turn, 10 in all
  seed = next(s for s in range(100) if len(env.gold_plan("frozenlake", s)) >= 3)
  plan = env.gold_plan("frozenlake", seed)
  env.reset("frozenlake", seed)
  r = env.step("nothing useful")
  assert r.reward == pytest.approx(-0.1) and not r.info.valid and r.info.moves == 0
  assert r.observation.startswith("Your answer named no action.\n") and not r.done
  assert puzzles.parse_actions(r.observation, fl.ACTIONS)[0] == []  # echoing it does nothing
  r = env.step(f"{plan[0]} || fly")  # one valid piece runs, the turn is still penalised
  assert r.info.executed_action == plan[0] and r.reward == pytest.approx(-0.1)
  assert r.info.score == pytest.approx(-0.2) and r.info.moves == 1
  # 7 actions in one answer: only max_actions_per_turn = 5 run
  opposite = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}
  back = [opposite[plan[0]], plan[0]] * 3 + [opposite[plan[0]]]
  r = env.step(" || ".join(back))
  assert r.info.moves == 6 and len(r.info.executed_action.split(" || ")) == 5
  assert r.observation.endswith("Actions remaining: 4.")
  env.reset("frozenlake", seed)
  for i in range(5):
    r = env.step("Up || Down" if i % 2 == 0 else "Down || Up")
    if r.done:
      break
  assert r.done and r.info.steps <= 5
  if not r.info.success:
    assert r.info.truncated or r.info.state.count("X") == 1
  with pytest.raises(RuntimeError, match="over"):
    env.step("Left")


def test_splits_disjoint_and_used_variations():
  env = fl.FrozenLakeEnv(fl.FrozenLakeConfig(num_train_variations=5, num_test_variations=20))
  train, test = env.variations("frozenlake", "train"), env.variations("frozenlake", "test")
  dev = env.variations("frozenlake", "dev")
  assert not set(train) & set(test) and not set(train) & set(dev) and not set(dev) & set(test)
  assert env.used_variations("frozenlake", "train") == [0, 1, 2, 3, 4]
  assert env.used_variations("frozenlake", "test") == list(range(2_000_000, 2_000_020))
  maps = {tuple(fl.generate_map(seed=s)) for s in env.used_variations("frozenlake", "train")}
  assert not maps & {
    tuple(fl.generate_map(seed=s)) for s in env.used_variations("frozenlake", "test")
  }
  with pytest.raises(ValueError, match="in no split"):
    env.reset("frozenlake", 500_000)
  with pytest.raises(ValueError, match="Valid tasks: frozenlake"):
    env.reset("frozen", 0)


def test_material_and_prompts():
  suite = registry.get_suite("frozenlake")
  env = suite.local_env(fl.FrozenLakeConfig(num_train_variations=3))
  rows = env.used_variations("frozenlake", "train") + env.used_variations("frozenlake", "test")[:2]
  mats = suite.materials(env, "frozenlake", rows, 2)
  assert set(mats) == {("frozenlake", v) for v in rows}
  m = mats[("frozenlake", 0)]
  assert len(m.few_shot) == 2 and "slippery" in m.instruction
  for traj in m.few_shot:
    assert traj.variation in puzzles.seeds("train") and traj.variation not in rows
    assert traj.final_score == 1.0
  obs, _ = env.reset("frozenlake", 0)
  first = suite.prompts.first_user_message(m, obs, ["tip one"])
  assert "Symbols: P you" in first and "Example 2" in first and "State:\n" in first
  assert strip_tips(first) == suite.prompts.first_user_message(m, obs)
  assert suite.prompts.step_user_message(obs).startswith("State:\n")
  assert suite.prompts.score_out_of is None


def test_pool_runs_frozenlake_in_worker_processes():
  suite = registry.get_suite("frozenlake")
  cfg = fl.FrozenLakeConfig(slippery=True)
  local = suite.local_env(cfg)
  episodes = [("frozenlake", s) for s in range(4)]
  turns = {s: local.gold_actions("frozenlake", s) for _, s in episodes}
  expected = {}
  for _, s in episodes:
    local.reset("frozenlake", s)
    expected[s] = [local.step(t) for t in turns[s][:1]]
  with EnvPool(suite.worker(cfg), PoolConfig(num_workers=2)) as pool:
    assert pool.java_pids() == [] and len(pool._workers) == 2
    first = pool.reset(episodes)
    assert [f.info.state for f in first] == [
      local.reset("frozenlake", s).info.state for _, s in episodes
    ]
    got = pool.step([turns[s][0] for _, s in episodes])
  for (_, s), r in zip(episodes, got):
    assert r == expected[s][0]  # same observation, reward, done and info as in-process
