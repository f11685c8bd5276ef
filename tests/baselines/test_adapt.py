"""Adaptation with memory only (baselines/adapt.py): tips are written after every trial and read in
the next; the weights stay bit-identical."""

import pytest

import jax

from empo2_jax.agent.memory import Memory
from empo2_jax.baselines.adapt import adapt
from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
from empo2_jax.memory.store import MemoryStore
from empo2_jax.model.encoder import Encoder
from tests.helpers import baselines_fakes as F


@pytest.mark.slow  # the tiny policy's sampler compiles (~10 s)
def test_memory_written_between_trials_and_params_bit_identical():
  encoder = Encoder.load()
  store = MemoryStore(dim=encoder.dim)
  memory = Memory(encoder, store, MemoryIndex(store, RetrievalConfig(threshold=0.5, top_k=3)))
  pool = F.ScriptedPool(length=2)
  actor = F.make_actor(pool, [0, 1], memory=memory)
  config, params = F.tiny_policy(2)
  before = F.param_bytes(params)
  recs = adapt(actor, params, config, F.TASK, [0, 1], 3, temperature=1.0, rng=jax.random.PRNGKey(3))
  assert [r["trial"] for r in recs] == [1, 2, 3]
  assert recs[0]["memory_before"] == 0 and recs[0]["retrieved_per_step"] == 0.0
  for prev, nxt in zip(recs, recs[1:]):
    assert prev["memory_after"] > prev["memory_before"]  # written after the trial ...
    assert nxt["memory_before"] == prev["memory_after"]
    assert nxt["retrieved_per_step"] > 0  # ... and read in the next
  assert {k[0] for k in store.keys()} == {F.TASK}
  assert pool.resets == {0: 3, 1: 3}
  assert F.param_bytes(params) == before


def test_adapt_needs_memory():
  with pytest.raises(ValueError, match="needs an Actor with a Memory"):
    adapt(
      F.make_actor(F.ScriptedPool(), [0]),
      None,
      None,
      F.TASK,
      [0],
      2,
      temperature=1.0,
      rng=jax.random.PRNGKey(0),
    )
