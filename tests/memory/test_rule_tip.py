"""The rule reflector (memory/rule_tip.py): the tip from score gains and unmet subgoals, the
empo2.reflector switch, and the goal progress it reads (ScienceWorld, in-process and pool)."""

import pytest

from empo2_jax.agent.episode import ActorSettings, Episode
from empo2_jax.memory import rule_tip
from empo2_jax.rl.batch import Turn

# ScienceWorld's getGoalProgressStr() as the simulator prints it (find-animal, tabs and rules).
GOALS = """Completed keys:
----------------------------------------------------------------------------------------------------
Sequential Subgoals:
----------------------------------------------------------------------------------------------------
0\ttrue\t                       GoalFocusOnAnimal\tfocus on an animal
1\tfalse\t                   GoalObjectInContainer\tmove living thing to answer box
----------------------------------------------------------------------------------------------------
Unordered and Optional Subgoals:
----------------------------------------------------------------------------------------------------
0\tfalse\t                   GoalObjectInContainer\tPick up object
1\ttrue\t                  GoalInRoomWithOpenDoor\tBe in a room with an open door
2\tfalse\t                   GoalMoveToNewLocation\tMove to a new location
----------------------------------------------------------------------------------------------------
"""


def test_tip_lists_score_raising_actions_with_gains_and_unmet_subgoals_only():
  actions = ["open door to hallway", "look around", "focus on cat", "pick up cat", "wait1"]
  deltas = [8, 0, 50, -3, 0.5]
  tip = rule_tip.rule_tip(actions, deltas, GOALS)
  assert tip == (
    "Actions that raised the score: open door to hallway (+8); focus on cat (+50); "
    "wait1 (+0.5). Unmet subgoals: move living thing to answer box. "
    "Unmet optional subgoals: Pick up object; Move to a new location."
  )
  # nothing else: no action without a gain, no met subgoal
  for absent in ("look around", "pick up cat", "focus on an animal", "open door)", "-3"):
    assert absent not in tip


def test_tip_without_gains_or_goal_text():
  assert rule_tip.rule_tip(["look around"], [0], "") == "No action raised the score."
  assert rule_tip.rule_tip([], [], GOALS).startswith("No action raised the score. Unmet subgoals:")
  with pytest.raises(ValueError, match="2 actions but 1 score deltas"):
    rule_tip.rule_tip(["a", "b"], [1], "")


def test_unmet_subgoals_split_sections_and_drop_repeats():
  seq, opt = rule_tip.unmet_subgoals(GOALS)
  assert seq == ["move living thing to answer box"]
  assert opt == ["Pick up object", "Move to a new location"]
  doubled = GOALS.replace("Move to a new location", "Pick up object")
  assert rule_tip.unmet_subgoals(doubled)[1] == ["Pick up object"]
  assert rule_tip.unmet_subgoals("") == ([], [])


def test_tip_is_length_capped_dropping_whole_items():
  actions = [f"move object number {k} to the red box in the kitchen" for k in range(40)]
  tip = rule_tip.rule_tip(actions, [1.0] * 40, GOALS, max_chars=200)
  assert len(tip) <= 200
  gains, _, rest = tip.partition("; ... ")
  assert rest == "Unmet subgoals: move living thing to answer box."  # a later section that fits
  items = gains[len("Actions that raised the score: ") :].split("; ")
  assert items == [f"{actions[k]} (+1)" for k in range(len(items))]  # whole items, in order
  with pytest.raises(ValueError, match="at least 40"):
    rule_tip.rule_tip(actions, [1.0] * 40, GOALS, max_chars=10)


def test_episode_rule_tip_reads_executed_actions_env_rewards_and_goals():
  e = Episode("find-animal", 0, 0, 0, "on", False)
  e.executed = ["teleport to outside", "focus on butterfly"]
  e.turns = [
    Turn([], raw, [], [], "on", 0, 0, step=k, episode_return=67.0, reward=r, intrinsic=1.0)
    for k, (raw, r) in enumerate([("go outside", 0.0), ("focus butterfly", 67.0)])
  ]
  e.goals = GOALS
  tip = rule_tip.episode_rule_tip(e)
  assert tip.startswith("Actions that raised the score: focus on butterfly (+67).")
  assert "teleport" not in tip and "focus butterfly" not in tip  # executed, not raw text


def test_reflector_switch_values():
  assert ActorSettings().reflector == "policy"
  assert ActorSettings(reflector="rule").reflector == "rule"
  with pytest.raises(ValueError, match=r"reflector='gold'; valid: policy .* rule"):
    ActorSettings(reflector="gold")


def test_reflector_config_field_default_and_bad_value():
  from empo2_jax import defaults
  from empo2_jax.train import build
  from empo2_jax.train import settings as settings_lib

  c = defaults.load_config("configs/sciworld.py:tiny")
  assert c.empo2.reflector == "policy"
  c = c.copy_and_resolve_references()
  c.unlock()
  c.empo2.reflector = "rule"
  assert settings_lib.actor_settings(c).reflector == "rule"
  c.empo2.reflector = "Rule"
  with pytest.raises(build.ConfigError, match="empo2.reflector='Rule'; valid: policy"):
    build.check_config(c)


# ------------------------------------------------------------ the goal progress it reads (real env)
@pytest.mark.slow
def test_goal_progress_matches_the_library_after_a_real_reset_and_step():
  """SciWorldEnv.goal_progress() is the library's get_goal_progress() on the same state, and the
  last step of an episode carries it (StepInfo.goals), in-process and from a pool worker."""
  from scienceworld import ScienceWorldEnv

  from empo2_jax.envs.pool import EnvPool, PoolConfig
  from empo2_jax.envs.scienceworld.env import SciWorldConfig, SciWorldEnv

  cfg = SciWorldConfig(default_max_steps=1, max_steps_overrides=())
  lib, env = ScienceWorldEnv("", envStepLimit=100), SciWorldEnv(cfg)
  try:
    lib.load("find-animal", 0, "easy")
    lib.reset()
    lib.step("look around")
    env.reset("find-animal", 0)
    last = env.step("look around")
    assert last.done and last.info.truncated
    assert env.goal_progress() == lib.get_goal_progress() == last.info.goals
    seq, opt = rule_tip.unmet_subgoals(last.info.goals)
    assert "focus on an animal" in seq and opt
  finally:
    lib.close()
    env.close()
  with EnvPool(cfg, PoolConfig(num_workers=1)) as pool:
    pool.reset([("find-animal", 0)])
    (res,) = pool.step(["look around"])
  assert res.done and res.info.goals == last.info.goals


@pytest.mark.slow
def test_training_iteration_with_the_rule_reflector_writes_rule_tips(tmp_path):
  """One EMPO2 iteration (tiny random policy, real ScienceWorld in pool workers) with
  empo2.reflector=rule: every stored memory entry carries a rule tip, through the usual write."""
  from configs import sciworld
  from empo2_jax.train.trainer import Trainer

  config = sciworld.get_config("tiny")
  config.empo2.reflector = "rule"
  config.empo2.force_mode = "on"
  trainer = Trainer(config, str(tmp_path), progress=False)
  try:
    result = trainer.train_iteration()
    m, episodes = result.metrics, result.episodes
  finally:
    trainer.close()
  assert m["tips_written"] == len(episodes) > 0
  for e in episodes:
    assert e.goals and e.tip == rule_tip.episode_rule_tip(e)  # goals came back from the workers
  store = trainer.memory.store
  texts = [t for k in store.keys() for t in store.slot(k).texts]
  assert texts and all(
    t.startswith(("Actions that raised the score: ", "No action raised the score."))
    and "; At that timestep, the specific action you took was " in t
    for t in texts
  )
