"""Actor-side memory: key construction within the encoder window (recent lines or the chat),
retrieval for unseen variations."""

import numpy as np
import pytest

from empo2_jax import tips
from empo2_jax.envs.scienceworld import prompts
from empo2_jax.envs.scienceworld.prompts import SCIENCEWORLD
from empo2_jax.agent.actor import Actor, ActorSettings, Episode, Memory
from empo2_jax.envs.fewshot import PromptMaterial
from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
from empo2_jax.memory.store import MemoryStore
from empo2_jax.model.encoder import Encoder
from empo2_jax.model.tokenizer import load_tokenizer

TASK = "find-animal"


@pytest.fixture(scope="module")
def encoder():
  return Encoder.load()


def _material(desc="Your task is to find a(n) animal."):
  return PromptMaterial(
    task_description=desc,
    action_templates=("look around",),
    inventory="",
    focus_items=(),
    few_shot=(),
  )


def test_key_keeps_task_and_current_observation_within_window(encoder):
  store = MemoryStore(dim=encoder.dim)
  actor = Actor(
    None,
    load_tokenizer(),
    {(TASK, 1): _material()},
    Memory(encoder, store, MemoryIndex(store)),
    ActorSettings(memory_key_text="recent"),
    prompt_set=SCIENCEWORLD,
  )
  ep = Episode(TASK, 1, 0, 0, "on", True)
  for t in range(60):  # a long episode: far more text than 256 word pieces
    ep.key_lines += [
      f"observation: You are in room number {t} with a table and a lamp.",
      f"action: go to room {t + 1}",
    ]
  key = actor.key_text(ep, "A green frog sits beside the pond.")
  assert key.startswith("task: Your task is to find a(n) animal.")
  assert key.endswith("observation: A green frog sits beside the pond.")
  assert "room number 59" in key and "room number 0 " not in key
  n_pieces = len(encoder.tokenizer.encode(key).ids)
  assert n_pieces <= encoder.cfg.max_seq_length
  # nothing of the key is lost to the encoder's own truncation
  full = encoder.tokenizer.encode(key)
  assert full.ids[-1] == encoder.tokenizer.token_to_id("[SEP]") and not full.overflowing


def test_unseen_variation_reads_nothing_unless_the_fallback_is_asked(encoder):
  store = MemoryStore(dim=encoder.dim)
  index = MemoryIndex(store, RetrievalConfig(threshold=0.5, top_k=3))
  texts = {
    (TASK, 1): [("tip a", 10.0), ("tip b", 90.0)],
    (TASK, 2): [("tip c", 50.0)],
    ("boil", 1): [("tip other task", 100.0)],
  }
  key = "task: find an animal\nobservation: kitchen with a fridge"
  emb = encoder.encode([key])[0]
  for slot, entries in texts.items():
    for text, score in entries:
      store.add(slot, text, score, emb, 0)
  mem = Memory(encoder, store, index)
  own, unseen = mem.retrieve([(TASK, 1), (TASK, 7)], [key, key])
  assert own == ["tip b", "tip a"]  # its own slot only, best score first
  assert unseen == []  # the authors' per-variation memory: no slot, no tips
  own, unseen = mem.retrieve([(TASK, 1), (TASK, 7)], [key, key], fallback=True)
  assert own == ["tip b", "tip a"]
  assert unseen == ["tip b", "tip c", "tip a"]  # every find-animal slot, merged by score
  assert mem.retrieve([("chemistry-mix", 1)], [key], fallback=True) == [[]]


def _chat_actor(encoder, **settings):
  store = MemoryStore(dim=encoder.dim)
  return Actor(
    None,
    load_tokenizer(),
    {(TASK, 1): _material()},
    Memory(encoder, store, MemoryIndex(store)),
    ActorSettings(memory_key_text="chat", **settings),
    prompt_set=SCIENCEWORLD,
  )


def test_chat_key_is_what_the_encoder_sees_of_the_whole_chat(encoder):
  actor = _chat_actor(encoder)
  ep = Episode(TASK, 1, 0, 0, "on", True)
  ep.messages = [{"role": "system", "content": "SYSTEM PROMPT"}]
  for t in range(40):  # far more than 256 word pieces
    ep.messages += [
      {"role": "user", "content": f"Observation: room {t} has a lamp and a table."},
      {"role": "assistant", "content": f"go to room {t + 1}"},
    ]
  full = "\n".join(f"{m['role']}: {m['content']}" for m in ep.messages[1:])
  full += "\nuser: " + actor.user_message(ep, "A frog.")
  key = actor.key_text(ep, "A frog.")
  assert key.startswith("user: Observation: room 0 has a lamp") and "SYSTEM" not in key
  assert full.startswith(key) and len(key) < len(full) and "A frog." not in key
  assert "assistant: go to room 1\n" in key
  np.testing.assert_allclose(encoder.encode([key]), encoder.encode([full]), atol=1e-6)
  # the window is full: one more word piece of the chat would not fit
  assert len(encoder.tokenizer.encode(key).ids) == encoder.cfg.max_seq_length
  # at the end ("final" keys): the whole chat, no pending user message
  ep.messages = ep.messages[:3]
  assert actor.key_text(ep, None) == (
    "user: Observation: room 0 has a lamp and a table.\nassistant: go to room 1"
  )


def test_chat_key_first_step_uses_the_tip_free_first_message(encoder):
  actor = _chat_actor(encoder)
  ep = Episode(TASK, 1, 0, 0, "on", True)
  key = actor.key_text(ep, "You are in the kitchen.")
  assert key == "user: " + prompts.first_user_message(_material(), "You are in the kitchen.")
  assert tips.TIP_OPEN not in key


def test_actor_settings_reject_unknown_key_switches():
  with pytest.raises(ValueError, match="memory_key_text='release'.*recent, chat"):
    ActorSettings(memory_key_text="release")
  with pytest.raises(ValueError, match="memory_key='last'.*step, final"):
    ActorSettings(memory_key="last")


def test_teacher_chats_show_the_turns_tips_in_its_last_user_message_only():
  """methods.set_teacher_chats through Actor.chats_with_tips: turn k's teacher chat is its own
  chat with tips_by_turn[k] in its last user message, the earlier user messages rebuilt without
  tips, the assistant messages unchanged; a turn without tips gets none."""
  import types

  from empo2_jax.methods.base import RolloutContext
  from empo2_jax.methods.teacher_views import set_teacher_chats

  actor = Actor(None, load_tokenizer(), {(TASK, 1): _material()}, prompt_set=SCIENCEWORLD)
  ep = Episode(TASK, 1, 0, 0, "on", False)
  ep.observations = [f"observation {j}" for j in range(3)]
  chat = []
  for j in range(3):
    chat.append({"role": "user", "content": actor._user_text(ep, j == 0, ep.observations[j], ())})
    ep.turns.append(types.SimpleNamespace(messages=list(chat), teacher_messages=None))
    chat.append({"role": "assistant", "content": f"action {j}"})
  ctx = RolloutContext(rollout=None, seed=0, score_out_of=100.0,
                               chats_with_tips=actor.chats_with_tips)  # fmt: skip
  assert set_teacher_chats(ctx, ep, [["tip A"], [], ["tip C"]]) == 2
  assert ep.turns[1].teacher_messages is None
  for k, tip in ((0, "tip A"), (2, "tip C")):
    got = ep.turns[k].teacher_messages
    assert [m["role"] for m in got] == [m["role"] for m in ep.turns[k].messages]
    assert tip in got[-1]["content"] and ep.observations[k] in got[-1]["content"]
    assert got[:-1] == ep.turns[k].messages[:-1]  # tip-free before, as sampled
    want = actor.chats_with_tips(ep, [[]] * k + [[tip]])[k]  # every turn built, then turn k
    assert got == want
