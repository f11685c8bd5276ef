"""HeRL (methods/herl.py): HE token weight (rl/losses.shaped_ratio) and bonus vs numpy,
candidates, injection, goal parsing, and the HE (policy-shaped) term of the policy loss."""

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.text import parse_goal_progress
from empo2_jax.methods import herl
from empo2_jax.rl.losses import policy_loss, shaped_ratio
from tests.helpers.rl_settings import batch_config, loss_config

GOALS = """Completed keys:
----------------------------------------------------------------------------------------------------
Sequential Subgoals:
----------------------------------------------------------------------------------------------------
0	false	                       GoalFocusOnAnimal	focus on an animal
1	false	                   GoalObjectInContainer	move living thing to answer box
----------------------------------------------------------------------------------------------------
Unordered and Optional Subgoals:
----------------------------------------------------------------------------------------------------
0	false	                   GoalObjectInContainer	Pick up object
1	true	                  GoalInRoomWithOpenDoor	Be in a room with an open door
2	true	                   GoalMoveToNewLocation	Move to a new location
----------------------------------------------------------------------------------------------------
"""


def test_he_weight_vs_numpy():
  lr = np.array([-30.0, -2.0, -0.1, 0.0, 0.5, 3.0, 40.0])
  for gamma in (1.0, 0.1):
    rho = np.exp(np.clip(lr, -20, 20))
    np.testing.assert_allclose(
      np.asarray(shaped_ratio(jnp.asarray(lr), gamma)), rho / (rho + gamma), rtol=1e-6
    )
  assert float(shaped_ratio(0.0, 1.0)) == pytest.approx(0.5)  # on-policy: 1/(1+gamma)


def test_he_weight_gradient_vs_hand_derivative():
  """d w / d log pi = rho * gamma / (rho + gamma)^2."""
  for x, gamma in ((0.3, 1.0), (-1.2, 0.1)):
    g = jax.grad(lambda v: shaped_ratio(v, gamma))(x)
    rho = np.exp(x)
    assert float(g) == pytest.approx(rho * gamma / (rho + gamma) ** 2, rel=1e-5)


def test_bonus_vs_numpy():
  assert herl.bonus(20.0, 60.0, 0.05) == pytest.approx(0.05 * 40.0)
  assert herl.bonus(50.0, 10.0, 0.05) == pytest.approx(-2.0)  # may be negative
  r, rw = herl.shift_scores([30.0, 30.0, 30.0], [10.0, 0.0, 20.0], 1.5)
  assert r == [31.5, 31.5, 31.5] and rw == [10.0, 0.0, 21.5]
  assert sum(rw) - 30.0 == pytest.approx(1.5)  # the summed score moves by exactly delta


def test_candidates_and_injection():
  M = herl.Member
  groups = {
    "g0": [M(0, 10.0, False), M(1, 40.0, False), M(2, 40.0, False)],
    "g1": [M(3, 100.0, True), M(4, 0.0, False)],
  }
  assert herl.candidates(groups) == {"g0": 1}  # ties -> the lowest index; g1 has a success
  rng = np.random.default_rng(0)
  slots = []
  for _ in range(300):
    slot, use, src = herl.injection(groups["g0"], 40.0, rng)
    slots.append(slot)
    assert use and src == 1  # >= the best original: the guided episode goes in
  assert set(slots) == {0, 1, 2}  # uniform over the group
  _, use, src = herl.injection(groups["g0"], 39.0, np.random.default_rng(1))
  assert not use and src == 1  # fallback: a copy of the best original


def test_goal_items_scienceworld_and_puzzle():
  items = parse_goal_progress(GOALS)
  assert items[0] == ("focus on an animal", False) and items[3][1] is True and len(items) == 5
  unmet, met = herl.goal_items(GOALS, success=False)
  assert unmet == ["focus on an animal", "move living thing to answer box", "Pick up object"]
  assert met == ["Be in a room with an open door", "Move to a new location"]
  assert herl.goal_items("", False, "fell into a hole") == (
    ["reach the goal (the attempt fell into a hole)"],
    [],
  )
  block = herl.hindsight_block("35/100", unmet, met, ["look around", "go to kitchen"])
  assert block.startswith("<hindsight>") and block.rstrip().endswith("</hindsight>")
  assert "Goals it did not reach: focus on an animal;" in block and "go to kitchen" in block
  many = herl.hindsight_block("0", ["g"], actions=[f"a{i}" for i in range(20)], max_actions=3)
  assert "Its last 3 of 20 actions: a17; a18; a19." in many


def test_policy_loss_he_tokens_use_the_weight_without_clipping():
  rng = np.random.default_rng(0)
  B, R = 4, 3
  logp = rng.normal(-2, 1, (B, R)).astype(np.float32)
  old = (logp + rng.normal(0, 0.8, (B, R))).astype(np.float32)
  adv = np.array([1.0, -1.0, 2.0, -0.5], np.float32)
  mask = np.ones((B, R), np.float32)
  he = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]], np.float32)
  cfg = loss_config(low_prob_mask=False, dual_clip=None)
  loss, met = policy_loss(
    jnp.asarray(logp),
    jnp.asarray(old),
    jnp.asarray(adv),
    jnp.asarray(mask),
    cfg,
    shaping_gamma_br=jnp.asarray(0.5 * he),
  )
  ratio = np.exp(logp - old)
  a = adv[:, None] * np.ones((1, R))
  ppo = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.3))
  he_term = -a * ratio / (ratio + 0.5)
  want = np.where(he > 0, he_term, ppo).mean()
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(met["shaped_token_frac"]) == pytest.approx(0.5)
  loss_plain, _ = policy_loss(
    jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), cfg
  )
  assert float(loss_plain) == pytest.approx(ppo.mean(), rel=1e-5)


def test_batches_carry_shaping_gamma_and_token_temperatures():
  """rl/batch.py: shaping_gamma and token_temperature follow the turns into both layouts."""
  from empo2_jax.model.tokenizer import load_tokenizer
  from empo2_jax.rl.batch import Turn, build_batch, build_packed_batch

  tok = load_tokenizer(None)
  turns = []
  for r, he in ((0, False), (1, True)):
    msgs = [{"role": "user", "content": f"go {r}"}]
    for s in range(2):
      ids = tok(f" move {s}", add_special_tokens=False)["input_ids"]
      temps = [1.3] * len(ids) if r == 0 else None
      turns.append(
        Turn(
          list(msgs),
          f" move {s}",
          ids,
          [-1.0] * len(ids),
          "on",
          0,
          r,
          s,
          0.0,
          token_temps=temps,
          shaping_gamma=0.5 if he else 0.0,
        )
      )
      msgs += [{"role": "assistant", "content": f" move {s}"}, {"role": "user", "content": "ok"}]
  cfg = batch_config(response_len=8, pad_id=tok.pad_token_id, micro_rows=2)
  flat, _ = build_batch(turns, np.zeros(4), tok, cfg)
  for row, i in enumerate(flat["sample_index"][:4]):
    n = len(turns[i].response_ids)
    assert flat["shaping_gamma"][row] == turns[i].shaping_gamma
    want = np.float32(1.3 if turns[i].token_temps else 0.0)
    np.testing.assert_array_equal(flat["token_temperature"][row, :n], want)
  packed, _ = build_packed_batch(turns, np.zeros(4), tok, cfg)
  idx = packed["sample_index"]
  for b, k in zip(*np.nonzero(idx >= 0)):
    i = idx[b, k]
    assert packed["shaping_gamma"][b, k] == turns[i].shaping_gamma
    assert packed["token_temperature"][b, k, 0] == np.float32(1.3 if turns[i].token_temps else 0)
  plain = [dataclasses.replace(t, shaping_gamma=0.0, token_temps=None) for t in turns]
  keys = set(build_batch(plain, np.zeros(4), tok, cfg)[0])
  assert not {"shaping_gamma", "token_temperature"} & keys


@pytest.mark.slow
def test_scienceworld_reports_goal_progress_at_the_end():
  """StepInfo.goals at the episode's end: a solved episode has every sequential subgoal done; a
  cut-off one lists unmet goals for the hindsight block."""
  from empo2_jax.envs.scienceworld.env import SciWorldConfig, SciWorldEnv

  env = SciWorldEnv(SciWorldConfig(num_train_variations=2, num_test_variations=2,
                                   default_max_steps=2, max_steps_overrides=()))  # fmt: skip
  try:
    env.reset("find-animal", 0)
    first = env.step("look around")
    assert first.info.goals == ""  # not done yet: no extra JVM call
    last = env.step("look around")
    assert last.done and last.info.truncated
    unmet, met = herl.goal_items(last.info.goals, last.info.success)
    assert "focus on an animal" in unmet
  finally:
    env.close()
