"""Checkpointer and trainer-state restore (fast: a fake trainer, no environments or model)."""

import json
import logging
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.agent.memory import Memory
from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
from empo2_jax.memory.store import MemoryStore
from empo2_jax.rl import update as update_lib
from empo2_jax.train import checkpoint as ckpt_lib
from configs import sciworld
from tests.helpers.rl_settings import update_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeTrainer:
  """The attributes save_trainer / restore_trainer use, with a small optax state."""

  def __init__(self, workdir, seed):
    rng = np.random.default_rng(seed)
    params = {
      "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
      "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
    }
    opt = update_lib.make_optimizer(update_config())
    self.state = update_lib.init_train_state(params, opt)
    self.state = self.state._replace(step=jnp.asarray(seed, jnp.int32))
    self.rng = jax.random.PRNGKey(seed)
    self.iteration, self.variation_cursor = 0, 0
    self.update_floor = {"len": 128 * seed, "turns": seed, "slots": 1, "slot_rows": 0}
    self.workdir, self.config = str(workdir), sciworld.get_config("tiny")
    store = MemoryStore(dim=8, max_per_slot=3)
    for i in range(seed):  # seed 0: an empty memory
      store.add(("find-animal", i % 2), f"tip {i} é", float(i), rng.normal(size=8), i)
    self.memory = Memory(None, store, MemoryIndex(store, RetrievalConfig()))


def _write_metrics(workdir, upto):
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for i in range(1, upto + 1):
      f.write(json.dumps({"iteration": i, "return_mean": 0.5 * i, "mode": "on"}) + "\n")


def _equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save_steps(tmp_path, seeds):
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=5)
  saved = {}
  for step, seed in enumerate(seeds, start=1):
    t = FakeTrainer(tmp_path, seed)
    t.iteration, t.variation_cursor = step, 10 * step
    _write_metrics(tmp_path, step)
    ckpt_lib.save_trainer(ckpt, t)
    saved[step] = t
  ckpt.close()
  return saved


def test_restore_latest_state_memory_and_metrics(tmp_path):
  saved = _save_steps(tmp_path, seeds=[0, 5, 7])
  _write_metrics(tmp_path, 6)  # the killed run got further than its checkpoint
  with open(os.path.join(tmp_path, "metrics.jsonl"), "a") as f:
    f.write('{"iteration": 7, "retu')  # and died mid-line
  t = FakeTrainer(tmp_path, seed=1)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=5)
  assert ckpt_lib.restore_trainer(ckpt, t) == 3
  want = saved[3]
  _equal(t.state, want.state)
  _equal(t.rng, want.rng)
  assert type(t.state) is type(want.state)
  assert (t.iteration, t.variation_cursor) == (3, 30)
  assert t.update_floor == want.update_floor  # a resumed run keeps its update shape
  assert (
    ckpt_lib.memory_to_blob(t.memory.store).tobytes()
    == ckpt_lib.memory_to_blob(want.memory.store).tobytes()
  )
  assert len(t.memory.store) == 6 and t.memory.index.store is t.memory.store
  hits = t.memory.index.search(
    ("find-animal", 0), want.memory.store.slot(("find-animal", 0)).embeddings[0]
  )
  assert hits and hits[0].cosine > 0.99
  assert [r["iteration"] for r in ckpt_lib.read_records(tmp_path)] == [1, 2, 3]
  ckpt.close()


def test_a_checkpoint_with_the_cursor_under_its_older_name_restores(tmp_path):
  """Checkpoints written before the cursor was renamed hold "row_cursor" in their meta."""
  _save_steps(tmp_path, seeds=[2])
  (path,) = [p for p in (tmp_path / "checkpoints" / "1").rglob("*") if p.is_file()
             and b'"variation_cursor"' in p.read_bytes()]  # fmt: skip
  path.write_bytes(path.read_bytes().replace(b'"variation_cursor"', b'"row_cursor"'))
  t = FakeTrainer(tmp_path, seed=1)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=5)
  assert ckpt_lib.restore_trainer(ckpt, t) == 1
  assert (t.iteration, t.variation_cursor) == (1, 10)
  ckpt.close()


def test_keeps_last_n(tmp_path):
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=2)
  t = FakeTrainer(tmp_path, seed=2)
  for step in range(1, 5):
    t.iteration = step
    ckpt_lib.save_trainer(ckpt, t)
  ckpt.wait()
  assert ckpt.steps() == [3, 4]
  ckpt.close()


def test_checkpoint_async_setting_and_a_synchronous_save(tmp_path):
  assert [ckpt_lib.async_saves(s, "cpu") for s in ckpt_lib.CHECKPOINT_ASYNC] == [False, True, False]
  assert [ckpt_lib.async_saves(s, "tpu") for s in ckpt_lib.CHECKPOINT_ASYNC] == [True, True, False]
  with pytest.raises(ValueError, match="checkpoint_async='sync'; valid: auto"):
    ckpt_lib.async_saves("sync", "cpu")
  from empo2_jax.train.build import ConfigError, check_config

  c = sciworld.get_config("tiny")
  c.train.checkpoint_async = "sync"
  with pytest.raises(ConfigError, match="valid: auto"):
    check_config(c)
  # a synchronous save is finished when save() returns: restorable by another checkpointer
  # while this one is still open, and no save is in flight
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=2, async_save=False)
  t = FakeTrainer(tmp_path, seed=3)
  t.iteration = 1
  ckpt_lib.save_trainer(ckpt, t)
  assert ckpt._pending is None or not ckpt.manager.is_saving_in_progress()
  other = FakeTrainer(tmp_path, seed=4)
  assert ckpt_lib.restore_trainer(ckpt_lib.Checkpointer(tmp_path / "checkpoints"), other) == 1
  _equal(other.state, t.state)
  ckpt.close()


@pytest.mark.parametrize("damage", ["truncate", "delete_meta"])
def test_corrupt_latest_falls_back_to_previous(tmp_path, caplog, damage):
  saved = _save_steps(tmp_path, seeds=[3, 4])
  step_dir = tmp_path / "checkpoints" / "2"
  if damage == "truncate":  # every data file of the step cut to half
    files = [p for p in step_dir.rglob("*") if p.is_file() and "/d/" in str(p)]
    assert files
    for p in files:
      p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
  else:
    os.remove(step_dir / "meta" / "metadata")
  t = FakeTrainer(tmp_path, seed=0)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints", keep=5)
  with caplog.at_level(logging.WARNING, logger="empo2_jax"):
    assert ckpt_lib.restore_trainer(ckpt, t) == 1
  assert any(str(step_dir) in r.getMessage() for r in caplog.records), caplog.text
  _equal(t.state, saved[1].state)
  assert len(t.memory.store) == 3
  moved = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("corrupt-2-")]
  assert moved and ckpt.steps() == [1]
  t.iteration = 2  # the resumed run can write step 2 again
  ckpt_lib.save_trainer(ckpt, t, wait=True)
  assert ckpt.steps() == [1, 2]
  ckpt.close()


def test_nothing_to_resume_and_nothing_restorable(tmp_path):
  t = FakeTrainer(tmp_path, seed=1)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
  assert ckpt_lib.restore_trainer(ckpt, t) is None and t.iteration == 0
  ckpt.close()
  os.makedirs(tmp_path / "b")
  _save_steps(tmp_path / "b", seeds=[1])
  os.remove(tmp_path / "b" / "checkpoints" / "1" / "meta" / "metadata")
  ckpt = ckpt_lib.Checkpointer(tmp_path / "b" / "checkpoints")
  with pytest.raises(RuntimeError, match="no checkpoint"):
    ckpt_lib.restore_trainer(ckpt, FakeTrainer(tmp_path / "b", seed=1))
  ckpt.close()


def test_read_memory_takes_the_newest_steps_memory_read_only(tmp_path):
  """config.memory.init_from: another run's memory, without touching that run's checkpoints."""
  saved = _save_steps(tmp_path, seeds=[3, 5])
  before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  step, store = ckpt_lib.read_memory(tmp_path)
  assert step == 2 and len(store) == 5
  assert (
    ckpt_lib.memory_to_blob(store).tobytes()
    == ckpt_lib.memory_to_blob(saved[2].memory.store).tobytes()
  )
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
  with pytest.raises(FileNotFoundError, match="memory.init_from"):
    ckpt_lib.read_memory(tmp_path / "elsewhere")
