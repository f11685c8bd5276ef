"""The authors' behaviour by default (docs/fidelity.md): the table's defaults are the config's,
per-variation memory in training (nothing retrieved without a slot, r_int = 1), the task fallback
only where `memory.unseen_fallback` asks, the reflection chat variants, and the GRPO-family methods
without the low-probability mask."""

import os
import re
import types

import numpy as np
import pytest

import jax

from configs import sciworld
from empo2_jax import tips
from empo2_jax.agent.actor import Memory, Rollout
from empo2_jax.agent.memory import chat_key
from empo2_jax.baselines import adapt as adapt_lib
from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
from empo2_jax.memory.reflect import TIP_PROMPT, reflection_chat
from empo2_jax.memory.store import MemoryStore
from empo2_jax.model.encoder import Encoder
from empo2_jax import methods
from empo2_jax.train.evaluate import Evaluator
from tests.helpers import baselines_fakes as fakes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = fakes.TASK


def _table_defaults():
  """{config path: default text} from the switch and default columns of docs/fidelity.md."""
  rows = {}
  with open(os.path.join(ROOT, "docs", "fidelity.md")) as f:
    lines = [ln for ln in f if ln.startswith("| ") and not ln.startswith("| behaviour")]
  for ln in lines:
    cells = [c.strip() for c in ln.strip().strip("|").split("|")]
    switch, default = cells[4], cells[5]
    keys = [k for k in re.findall(r"`([^`]+)`", switch) if re.fullmatch(r"[a-z0-9_]+\.\w+", k)]
    values = re.findall(r"`([^`]+)`", default)
    if keys:
      assert len(keys) == len(values), f"docs/fidelity.md row {cells[0]!r}: {keys} vs {values}"
      rows.update(zip(keys, values))
  return rows


def _same(value, text: str) -> bool:
  if isinstance(value, bool):
    return str(value) == text
  if isinstance(value, (int, float)):
    return float(value) == float(text)
  return str(value) == text


def test_docs_fidelity_defaults_are_the_configs():
  table = _table_defaults()
  assert len(table) >= 20  # every row with a switch was read
  c = sciworld.get_config()
  for path, text in table.items():
    section, field = path.split(".")
    assert _same(c[section][field], text), f"{path}: config {c[section][field]!r}, table {text}"


def test_cpu_variants_keep_the_authors_switches_but_pack_rows():
  paper = sciworld.get_config()
  for variant in ("cpu", "tiny", "learn", "learn,wide"):
    c = sciworld.get_config(variant)
    assert c.optim.layout == "packed"  # the documented exception (cost)
    for path in ("empo2.memory_key_text", "empo2.tip_chat", "env.action_correction"):
      section, field = path.split(".")
      assert c[section][field] == paper[section][field], (variant, path)


# --- methods -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grpo", "gigpo", "gigpo_std", "sge", "herl", "spa"])
def test_grpo_family_runs_without_the_low_prob_mask(name):
  c = methods.apply(sciworld.get_config(), name)
  assert c.loss.low_prob_mask is False and c.empo2.p_memory == 0.0


@pytest.mark.parametrize("name", ["empo2", "empo2_rnd"])
def test_empo2_keeps_the_low_prob_mask(name):
  c = methods.apply(sciworld.get_config(), name)
  assert c.loss.low_prob_mask is True


def test_an_explicit_mask_override_wins_over_the_method():
  c = sciworld.get_config()
  c.loss.low_prob_mask = True  # as --config.loss.low_prob_mask=True would
  methods.apply(c, "grpo", keep={"loss.low_prob_mask"})
  assert c.loss.low_prob_mask is True


# --- reflection chat -----------------------------------------------------------------------------

_CHAT = [
  {"role": "user", "content": "Observation: hall.\n\n" + tips.tip_block(["go north"]) + "Act."},
  {"role": "assistant", "content": "go to kitchen"},
  {"role": "user", "content": "Observation: kitchen.\n\nAct."},
  {"role": "assistant", "content": "open fridge"},
]


def test_reflection_chat_paper_is_tip_free_without_outcome():
  chat = reflection_chat(_CHAT, "paper", "The fridge is open.", "OUTCOME ")
  assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant", "user"]
  assert chat[0]["content"] == "Observation: hall.\n\nAct."
  assert chat[-1]["content"] == TIP_PROMPT
  assert not any("fridge is open" in m["content"] or "OUTCOME" in m["content"] for m in chat)


def test_reflection_chat_release_keeps_tips_as_text_and_the_last_observation():
  chat = reflection_chat(_CHAT, "release", "The fridge is open.", "OUTCOME ")
  assert "<tip>" not in chat[0]["content"] and "</tip>" not in chat[0]["content"]
  assert "previous exploration:\ngo north\n" in chat[0]["content"]
  assert chat[-2] == {"role": "user", "content": "The fridge is open."}
  assert chat[-1]["content"] == TIP_PROMPT and not any("OUTCOME" in m["content"] for m in chat)


def test_reflection_chat_outcome_keeps_tip_blocks_and_shows_the_outcome():
  chat = reflection_chat(_CHAT, "outcome", "The fridge is open.", "OUTCOME ")
  assert chat[:4] == _CHAT
  assert chat[-1]["content"] == "OUTCOME " + TIP_PROMPT
  with pytest.raises(ValueError, match="tip_chat='ours'; valid: paper, release, outcome"):
    reflection_chat(_CHAT, "ours")


def test_chat_key_leaves_out_tip_blocks():
  key = chat_key(_CHAT)
  assert "<tip>" not in key and "go north" not in key
  assert key.startswith("user: Observation: hall.\n\nAct.\nassistant: go to kitchen")


# --- per-variation memory in a real rollout ------------------------------------------------------


@pytest.fixture(scope="module")
def encoder():
  return Encoder.load()


def _memory(encoder):
  store = MemoryStore(dim=encoder.dim)
  # threshold -1: every stored entry passes the cosine test, so retrieval counts only slots
  index = MemoryIndex(store, RetrievalConfig(threshold=-1.0, top_k=10))
  emb = encoder.encode(["any key"])[0]
  for k in range(3):
    store.add((TASK, 1), f"tip {k} of variation 1", float(k), emb, 0)
  return Memory(encoder, store, index)


@pytest.mark.parametrize("fallback", [False, True])
def test_training_variation_without_a_slot_retrieves_nothing_and_gets_r_int_1(encoder, fallback):
  memory = _memory(encoder)
  actor = fakes.make_actor(fakes.ScriptedPool(length=2), [1, 2], memory)
  config, params = fakes.tiny_policy()
  specs = [(TASK, 1, 0), (TASK, 2, 1)]  # variation 1 has a slot, variation 2 none
  episodes = actor.rollout(
    params,
    config,
    specs,
    use_memory=True,
    temperature=1.0,
    rng=jax.random.PRNGKey(0),
    mode="on_tips",
    memory_fallback=fallback,
  ).episodes
  own, unseen = episodes
  assert own.retrieved == [3, 3]
  np.testing.assert_allclose([t.intrinsic for t in own.turns], [0.25, 0.25])
  if fallback:  # asked for: the task's other slots
    assert unseen.retrieved == [3, 3]
    assert unseen.tips_shown[0][0] == "tip 2 of variation 1"
  else:  # training: the authors' per-variation memory
    assert unseen.retrieved == [0, 0] and unseen.tips_shown == [[], []]
    np.testing.assert_allclose([t.intrinsic for t in unseen.turns], [1.0, 1.0])
    assert not any("<tip>" in m["content"] for m in unseen.messages)


class _RecordingActor:
  def __init__(self):
    self.calls = []
    self.memory = types.SimpleNamespace(store=[])

  def rollout(self, *args, **kwargs):
    self.calls.append(kwargs)
    return Rollout([], {"retrieved": 0, "memory_steps": 0})

  def reflect(self, rollout, iteration):
    return {}


@pytest.mark.parametrize("switch,expected", [("task", True), ("none", False)])
def test_evaluation_with_memory_falls_back_only_when_the_switch_says_so(switch, expected):
  c = sciworld.get_config("tiny")
  c.memory.unseen_fallback = switch
  actor = _RecordingActor()
  ev = Evaluator(c, actor, None, notes=lambda specs: None)
  ev.episodes(None, jax.random.PRNGKey(0), [0, 1], with_memory=True)
  assert [k["memory_fallback"] for k in actor.calls] == [expected]
  assert actor.calls[0]["use_memory"] is True


@pytest.mark.parametrize("fallback", [True, False])
def test_adapt_passes_the_fallback_switch(fallback):
  actor = _RecordingActor()
  adapt_lib.adapt(
    actor,
    None,
    None,
    TASK,
    [1],
    1,
    temperature=0.4,
    rng=jax.random.PRNGKey(0),
    memory_fallback=fallback,
  )
  assert actor.calls[0]["memory_fallback"] is fallback
