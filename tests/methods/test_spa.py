"""SPA (methods/spa.py): the SFT conversion puts the TRUE states in the targets; parsing, split,
Pass@k."""

import pytest

from empo2_jax.methods import spa
from empo2_jax.train.metrics import pass_at_k

S0 = "P _ _\n_ O _\n_ _ G"
S1 = "_ P _\n_ O _\n_ _ G"
S2 = "_ _ P\n_ O _\n_ _ G"


def test_conversion_puts_true_states_and_executed_actions_in_targets():
  wrong = (
    "<think><observation>a made-up grid</observation> go right <prediction>also made up"
    "</prediction></think><answer>Right</answer>"
  )
  messages = [
    {"role": "user", "content": "Turn 1: " + S0},
    {"role": "assistant", "content": wrong},
    {"role": "user", "content": "Turn 2: " + S1},
    {"role": "assistant", "content": "right again!!"},  # not the format: no thoughts kept
  ]
  chat = spa.episode_chat(messages, [S0, S1, S2], ["Right", "Right"])
  assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
  assert chat[0] == messages[0] and chat[2] == messages[2]  # prompts untouched
  first, second = spa.parse_wm(chat[1]["content"]), spa.parse_wm(chat[3]["content"])
  assert first == {"observation": S0, "thoughts": "go right", "prediction": S1, "answer": "Right"}
  assert second == {"observation": S1, "thoughts": "", "prediction": S2, "answer": "Right"}
  assert "made up" not in chat[1]["content"]
  assert messages[1]["content"] == wrong  # the input is not modified
  with pytest.raises(ValueError, match="need 3 states"):
    spa.episode_chat(messages, [S0, S1], ["Right", "Right"])


def test_conversion_with_sft_tokenisation_scores_the_states():
  """Through train/sft.py's chat_turns: the answer tokens (what SFT trains on) decode to the
  target with the true states."""
  from empo2_jax.model.tokenizer import load_tokenizer
  from empo2_jax.train.sft import chat_turns

  tok = load_tokenizer(None)
  messages = [
    {"role": "user", "content": "state?"},
    {"role": "assistant", "content": "Left"},
  ]
  chat = spa.episode_chat(messages, [S0, S1], ["Left"])
  _, answers = chat_turns(tok, chat)
  text = tok.decode(answers[0], skip_special_tokens=True)
  assert S0 in text and S1 in text and text.rstrip().endswith("<answer>Left</answer>")


def test_action_text_and_parse():
  assert spa.action_text("<think>x</think><answer> Up </answer>") == "Up"
  assert spa.action_text("<answer>Down") == "Down"  # cut by the token budget
  assert spa.action_text("<observation>grid</observation> Left") == "Left"
  assert spa.parse_wm("Left") is None


def test_split_and_pass_at_k():
  tr, va = spa.split(10, 0.2, seed=0)
  assert len(va) == 2 and sorted(tr + va) == list(range(10))
  assert spa.split(10, 0.2, seed=0) == (tr, va)
  assert spa.split(2, 0.2, seed=1)[1] and spa.split(2, 0.2, seed=1)[0]
  p1, pk, k = pass_at_k(["a"] * 4 + ["b"] * 4, [0, 0, 1, 0, 0, 0, 0, 0])
  assert (p1, pk, k) == (pytest.approx(1 / 8), pytest.approx(0.5), 4)


def test_valid_prefix_cuts_before_the_first_turn_without_an_action():
  msgs = [
    {"role": "user", "content": "u0"},
    {"role": "assistant", "content": "Right"},
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "hmm"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "Down"},
  ]
  got = spa.valid_prefix(msgs, [S0, S1, S1, S2], ["Right", "", "Down"])
  assert got == (msgs[:2], [S0, S1], ["Right"])
  assert spa.valid_prefix(msgs, [S0, S1, S1, S2], ["Right", "Up", "Down"]) == (
    msgs,
    [S0, S1, S1, S2],
    ["Right", "Up", "Down"],
  )
  assert spa.valid_prefix(msgs, [S0, S1, S1, S2], [" ", "Up", "Down"]) is None
