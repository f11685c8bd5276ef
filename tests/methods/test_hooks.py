"""The method plugins' hooks (methods/base.Hooks over methods/sge.py, herl.py, rnd.py, spa.py)
without a model: SGE notes and book, HeRL's bonus/injection/relabelling with a scripted guided
rollout, RND rewards only where EMPO2 gives its reward, env_text per method."""

import numpy as np
import pytest

from empo2_jax.agent.episode import Episode
from empo2_jax import config_keys
from empo2_jax.defaults import get_config
from empo2_jax.methods import herl, sge
from empo2_jax.methods import Hooks, RolloutContext
from empo2_jax.rl.batch import Turn


def _config(**over):
  c = get_config()
  c.rollout.group_size = 4
  for k, v in over.items():
    node, key = config_keys.lookup(c, k)
    node[key] = v
  return c


def _episode(gid, rid, score, success=False, steps=2, response="look"):
  e = Episode("t", 7, gid, rid, "on", False)
  e.score, e.success = float(score), success
  e.executed = [f"a{rid}{s}" for s in range(steps)]
  e.turns = [
    Turn([{"role": "user", "content": "u"}], response, [1], [-1.0], "on", gid, rid, s,
         float(score), reward=float(score) if s == steps - 1 else 0.0, obs_key=f"o{s}")
    for s in range(steps)
  ]  # fmt: skip
  return e


def test_method_settings_are_the_config_sections_by_name():
  """Each plugin builds its settings from its section by name; the dataclasses' defaults are the
  sections' defaults (each module's SECTION, which the base config holds)."""
  from empo2_jax.methods import rnd

  c = _config(**{"herl.gamma_s": 0.1, "sge.reflect_history": 5, "rnd.hidden": 64})
  assert herl.HeRL.settings(c) == herl.HeRLConfig(gamma_s=0.1)
  assert sge.SGE.settings(c) == sge.SGEConfig(reflect_history=5)
  want = rnd.RNDConfig(scale=c.empo2.intrinsic_scale, seed=c.seed, hidden=64)
  assert rnd.RNDPlugin.settings(c) == want
  base = get_config()
  assert herl.HeRL.settings(base) == herl.HeRLConfig()
  assert sge.SGE.settings(base) == sge.SGEConfig()
  assert rnd.RNDPlugin.settings(base) == rnd.RNDConfig(scale=1.0, seed=0)
  for mod in (herl, sge, rnd):
    assert dict(base[mod.__name__.rsplit(".", 1)[1]]) == mod.SECTION


def test_env_text_per_method():
  assert Hooks(_config()).env_text("<strategy> x </strategy> go") == ("<strategy> x </strategy> go")
  assert Hooks(_config(**{"sge.enabled": True})).env_text("<strategy> x </strategy> go") == "go"
  assert Hooks(_config(**{"spa.enabled": True})).env_text("<answer>Up</answer>") == "Up"


def test_sge_notes_reflect_from_the_second_iteration_on_a_share_of_the_group():
  ex = Hooks(_config(**{"sge.enabled": True}))
  specs = [("t", 7, 0)] * 4
  assert ex.train_notes(specs, 0) == [sge.STRATEGY_INSTRUCTION] * 4
  eps = [_episode(0, i, 10 * i, response=f"<strategy> plan {i} </strategy> go") for i in range(4)]
  m = ex.after_rollout(None, eps, 0, "on", None)[1]
  assert m["sge/strategy_closed_frac"] == 0.0  # no sampler calls were counted
  assert [e["strategy"] for e in ex.plugins[0].book.recent(("t", 7), 3)] == [
    "plan 1",
    "plan 2",
    "plan 3",
  ]
  notes = ex.train_notes(specs, 1)
  assert notes[0] == sge.STRATEGY_INSTRUCTION and notes[2] == sge.STRATEGY_INSTRUCTION
  assert "- plan 3 -> fail, score 30/100" in notes[1] and notes[1] == notes[3]
  assert ex.meta()["sge_book"] == ex.plugins[0].book.entries
  assert ex.eval_notes(specs) == [sge.STRATEGY_INSTRUCTION] * 4


class _Actor:
  def __init__(self, guided_scores):
    self.guided_scores, self.calls = guided_scores, []

  def rollout(self, params, model_config, specs, **kw):
    from empo2_jax.agent.actor import Rollout

    self.calls.append((specs, kw))
    out = []
    for i, (_, _, gid) in enumerate(specs):
      e = _episode(gid, i, self.guided_scores[gid], steps=1)
      out.append(e)
    return Rollout(out, {})


def _context(actor):
  """The trainer's RolloutContext (train/trainer.rollout_context) over a scripted actor."""

  def rollout(specs, **kw):
    return actor.rollout(None, None, specs, use_memory=False, mode="on", **kw)

  return RolloutContext(rollout=rollout, seed=0)


def test_herl_bonus_injection_and_relabelling():
  ex = Hooks(_config(**{"herl.enabled": True}))
  eps = [_episode(0, i, s) for i, s in enumerate([10, 40, 40, 0])]  # group 0 fails
  eps += [_episode(1, 4 + i, s, success=i == 0) for i, s in enumerate([100, 0, 0, 0])]
  actor = _Actor({0: 60.0})
  out, m = ex.after_rollout(_context(actor), eps, 3, "on", __import__("jax").random.PRNGKey(0))
  (specs, kw), = actor.calls  # fmt: skip
  assert specs == [("t", 7, 0)] and kw["temperature"] == 0.3 and kw["mode"] == "on"
  assert kw["notes"][0].startswith("<hindsight>") and "score 40/100" in kw["notes"][0]
  assert m["herl/groups_failed"] == 1 and m["herl/injected"] == 1
  assert m["herl/bonus_mean"] == pytest.approx(0.05 * (60 - 40))
  # the candidate (best failed, lowest index: rollout 1) trains with the bonus, scores unchanged
  cand = eps[1]
  assert [t.episode_return for t in cand.turns] == [41.0, 41.0] and cand.score == 40.0
  assert cand.turns[-1].reward == pytest.approx(41.0)
  # one slot of group 0 now holds the guided episode under that slot's ids, shaped by gamma_s
  rng = np.random.default_rng([0, 3, 1931])
  members = [herl.Member(i, eps[i].score, False) for i in range(4)]
  slot = herl.injection(members, 60.0, rng)[0]
  new = out[slot]
  assert new.score == 60.0 and new.rollout_id == slot and new.group_id == 0
  assert all(t.shaping_gamma == 1.0 and t.rollout_id == slot for t in new.turns)
  assert out[4:] == eps[4:]
  assert all(t.shaping_gamma == 0.0 for e in out if e is not new for t in e.turns)
  assert eps[slot] is not new  # the input list is not modified


def test_rnd_rewards_only_in_memory_rollouts_by_default():
  pytest.importorskip("flax")

  class _Enc:
    dim = 8

    def encode(self, texts):  # a fixed feature per state ("o0", "o1", "o2"): no str hash, which
      # Python salts per process, so three states could collide and give equal errors
      return np.array([[ord(t[-1]) % 7, len(t)] + [0.0] * 6 for t in texts], np.float32)

  ex = Hooks(_config(**{"empo2.intrinsic_reward": "rnd", "rnd.hidden": 16, "rnd.out": 4}),
                encoder=_Enc())  # fmt: skip
  eps = [_episode(0, i, 0, steps=3) for i in range(2)]
  m = ex.after_rollout(None, eps, 0, "on", None)[1]
  assert m["rnd/rewarded"] == 0 and all(t.intrinsic == 0 for e in eps for t in e.turns)
  m = ex.after_rollout(None, eps, 1, "on_tips", None)[1]
  got = [t.intrinsic for e in eps for t in e.turns]
  assert m["rnd/rewarded"] == 1 and max(got) == pytest.approx(1.0) and min(got) == 0.0
  assert int(ex.plugins[0].rnd.state.updates) == 2  # both iterations trained the predictor
