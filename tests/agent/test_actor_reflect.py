"""The reflect step (agent/actor.Actor.reflect -> agent/tip_writer.py, docs/method.md §2-3): after
a rollout, the tips of its finished episodes are written on the rollout's open session and go into
memory, one entry per executed step; the rule reflector samples nothing."""

import types

import pytest

import jax

from empo2_jax.agent import actor as actor_lib
from empo2_jax.agent import tip_writer
from empo2_jax.envs.scienceworld.prompts import SCIENCEWORLD
from empo2_jax.agent.actor import Rollout
from empo2_jax.agent.episode import ActorSettings, Episode
from empo2_jax.agent.memory import Memory
from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
from empo2_jax.memory.reflect import memory_text
from empo2_jax.memory.store import MemoryStore
from empo2_jax.model.encoder import Encoder
from empo2_jax.rl.batch import Turn
from tests.helpers import baselines_fakes as F


class _FakeTok:
  """Decodes nothing: a rule-reflector actor must not sample a tip at all."""

  def decode(self, *a, **k):
    raise AssertionError("the rule reflector decoded a sampled tip")


def test_reflect_with_the_rule_reflector_samples_nothing_and_writes_the_rule_tip(monkeypatch):
  writes = []
  monkeypatch.setattr(
    tip_writer, "gather_and_commit", lambda store, enc, w, it: (writes.extend(w), [1] * len(w))
  )
  a = object.__new__(actor_lib.Actor)
  a.settings = ActorSettings(reflector="rule", memory_key="step")
  a.tok, a.memory = _FakeTok(), types.SimpleNamespace(store=None, encoder=None)
  a.prompts = SCIENCEWORLD
  a.sample = lambda *args, **kw: pytest.fail("the rule reflector sampled")
  e = Episode("find-animal", 0, 0, 0, "on", False)
  e.executed, e.step_keys, e.score = ["focus on cat"], ["k0"], 50.0
  e.turns = [Turn([], "focus on cat", [], [], "on", 0, 0, step=0, episode_return=50.0, reward=50.0)]
  stats = a.reflect(Rollout([e], {}, own=[e]), iteration=3)  # no session: nothing to sample
  assert e.tip == "Actions that raised the score: focus on cat (+50)."
  assert (stats["tips"], stats["memory_writes"]) == (1, 1) and stats["time/rollout_reflect"] >= 0
  assert writes[0].slot == ("find-animal", 0) and writes[0].key == "k0"
  assert writes[0].text.startswith(e.tip + "; At that timestep, the specific action you took was")


@pytest.mark.slow  # MiniLM loads and the tiny policy's sampler compiles (~10 s)
def test_reflect_after_the_rollout_writes_every_step_and_then_the_session_is_freed():
  encoder = Encoder.load()
  store = MemoryStore(dim=encoder.dim)
  memory = Memory(encoder, store, MemoryIndex(store, RetrievalConfig(threshold=0.5, top_k=3)))
  actor = F.make_actor(F.ScriptedPool(length=2), [0, 1], memory=memory)
  config, params = F.tiny_policy(1)
  specs = [(F.TASK, 0, 0), (F.TASK, 1, 1)]
  rollout = actor.rollout(
    params, config, specs, use_memory=True, temperature=1.0, rng=jax.random.PRNGKey(5)
  )
  assert rollout.session is not None and not any(e.tip for e in rollout.episodes)
  assert rollout.stats["steps"] == 4 and rollout.stats["memory_steps"] == 4
  stats = actor.reflect(rollout, iteration=2)
  rollout.close()
  assert rollout.session is None
  with pytest.raises(ValueError, match="before Rollout.close"):
    actor.reflect(rollout, iteration=3)
  assert stats["tips"] == sum(bool(e.tip) for e in rollout.episodes)
  want = {}  # every executed step of an episode with a tip; the store drops exact duplicates
  for e in rollout.episodes:
    for action in e.executed if e.tip else ():
      want.setdefault((e.task, e.variation), []).append(memory_text(e.tip, action, e.score))
  got = {k: store.slot(k).texts for k in store.keys()}
  assert got == {k: list(dict.fromkeys(v)) for k, v in want.items()}
  assert stats["memory_writes"] == sum(map(len, got.values()))
  assert all(set(store.slot(k).iterations.tolist()) == {2} for k in got)
