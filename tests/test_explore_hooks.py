"""explore/hooks.py without a model: SGE notes and book, HeRL's bonus/injection/relabelling with a
scripted guided rollout, RND rewards only where EMPO2 gives its reward, env_text per method."""

import numpy as np
import pytest

from empo2_jax.agent.episode import Episode
from empo2_jax.defaults import get_config
from empo2_jax.explore import herl, sge
from empo2_jax.explore.hooks import Explorer
from empo2_jax.rl.batch import Turn


def _config(**over):
  c = get_config()
  c.rollout.group_size = 4
  for k, v in over.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
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
  """explore/config builds HeRL's, SGE's and RND's settings from their sections by name; the
  dataclasses' defaults are those sections' defaults (explore/config.HERL, SGE, RND)."""
  from empo2_jax.explore import config as xcfg
  from empo2_jax.explore import rnd

  c = _config(**{"herl.gamma_s": 0.1, "sge.reflect_history": 5, "rnd.hidden": 64})
  assert xcfg.herl_config(c) == herl.HeRLConfig(gamma_s=0.1)
  assert xcfg.sge_config(c) == sge.SGEConfig(reflect_history=5)
  assert xcfg.rnd_config(c) == rnd.RNDConfig(scale=c.empo2.intrinsic_scale, seed=c.seed, hidden=64)
  base = get_config()
  assert xcfg.herl_config(base) == herl.HeRLConfig()
  assert xcfg.sge_config(base) == sge.SGEConfig()


def test_env_text_per_method():
  assert Explorer(_config()).env_text("<strategy> x </strategy> go") == (
    "<strategy> x </strategy> go"
  )
  assert Explorer(_config(**{"sge.enabled": True})).env_text("<strategy> x </strategy> go") == "go"
  assert Explorer(_config(**{"spa.enabled": True})).env_text("<answer>Up</answer>") == "Up"


def test_sge_notes_reflect_from_the_second_iteration_on_a_share_of_the_group():
  ex = Explorer(_config(**{"sge.enabled": True}))
  specs = [("t", 7, 0)] * 4
  assert ex.train_notes(specs, 0) == [sge.STRATEGY_INSTRUCTION] * 4
  eps = [_episode(0, i, 10 * i, response=f"<strategy> plan {i} </strategy> go") for i in range(4)]
  m = ex.after_rollout(None, eps, 0, "on", None)[1]
  assert m["sge/strategy_closed_frac"] == 0.0  # no sampler calls were counted
  assert [e["strategy"] for e in ex.book.recent(("t", 7), 3)] == ["plan 1", "plan 2", "plan 3"]
  notes = ex.train_notes(specs, 1)
  assert notes[0] == sge.STRATEGY_INSTRUCTION and notes[2] == sge.STRATEGY_INSTRUCTION
  assert "- plan 3 -> fail, score 30/100" in notes[1] and notes[1] == notes[3]
  assert ex.meta()["sge_book"] == ex.book.entries
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


class _Trainer:
  def __init__(self, actor):
    self.actor, self.model_config = actor, None

  def sampling_params(self):
    return None


def test_herl_bonus_injection_and_relabelling():
  ex = Explorer(_config(**{"herl.enabled": True}))
  eps = [_episode(0, i, s) for i, s in enumerate([10, 40, 40, 0])]  # group 0 fails
  eps += [_episode(1, 4 + i, s, success=i == 0) for i, s in enumerate([100, 0, 0, 0])]
  actor = _Actor({0: 60.0})
  out, m = ex.after_rollout(_Trainer(actor), eps, 3, "on", __import__("jax").random.PRNGKey(0))
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

  ex = Explorer(_config(**{"empo2.intrinsic_reward": "rnd", "rnd.hidden": 16, "rnd.out": 4}),
                encoder=_Enc())  # fmt: skip
  eps = [_episode(0, i, 0, steps=3) for i in range(2)]
  m = ex.after_rollout(None, eps, 0, "on", None)[1]
  assert m["rnd/rewarded"] == 0 and all(t.intrinsic == 0 for e in eps for t in e.turns)
  m = ex.after_rollout(None, eps, 1, "on_tips", None)[1]
  got = [t.intrinsic for e in eps for t in e.turns]
  assert m["rnd/rewarded"] == 1 and max(got) == pytest.approx(1.0) and min(got) == 0.0
  assert int(ex.rnd.state.updates) == 2  # the predictor trained on both iterations' states
