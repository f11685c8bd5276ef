"""Reflexion: the next trial's prompt holds exactly the last N reflections, solved variations are
not run again, reflections are written only for failures, and the weights never change."""

import numpy as np
import pytest

import jax

from empo2_jax.baselines import reflexion as rx
from tests.helpers import baselines_fakes as F


def test_memory_block_and_reflection_chat():
  refl = [(0, "plan A"), (1, "plan B"), (3, "plan D")]
  block = rx.memory_block(refl, 2)
  assert block == rx.MEMORY_HEADER + "\nTrial 2:\nplan B\nTrial 4:\nplan D"
  assert rx.memory_block(refl, 0) == "" and rx.memory_block([], 3) == ""
  chat = rx.reflection_messages("Task: x\n" + "y" * 50, refl, 2, max_chars=20)
  (msg,) = chat
  text = msg["content"]
  assert text.startswith(rx.REFLECTION_PROMPT) and text.endswith("New plan:")
  assert "Trial #2: plan B\nTrial #4: plan D" in text and "plan A" not in text
  assert "..." + "y" * 20 in text and "Task: x" not in text  # cut from the front
  assert rx.clean_reflection("Plan:\n go <|im_end|> there\x07 ") == "Plan: go there"


class _Writer:
  def __init__(self):
    self.calls = []

  def __call__(self, chats, rng):
    self.calls.append(chats)
    return [f"plan {len(self.calls)}.{i}" for i in range(len(chats))]


@pytest.mark.slow  # the tiny policy's sampler compiles (~10 s)
def test_trials_prompts_hold_last_n_reflections_and_params_do_not_change():
  pool = F.ScriptedPool(length=2, solve_at={1: 2})  # variation 1 succeeds in its 2nd trial
  actor = F.make_actor(pool, [0, 1])
  config, params = F.tiny_policy()
  before = F.param_bytes(params)
  writer = _Writer()
  cfg = rx.ReflexionConfig(trials=4, memory_size=2)
  res = rx.run(
    actor,
    params,
    config,
    F.TASK,
    [0, 1],
    cfg,
    temperature=1.0,
    rng=jax.random.PRNGKey(0),
    writer=writer,
  )
  # variation 1: run in trials 1 and 2 only (solved in 2), variation 0 in all four
  assert pool.resets == {0: 4, 1: 2}
  assert res.ran.tolist() == [[True, True], [True, True], [True, False], [True, False]]
  assert res.successes[:, 1].tolist() == [False, True, True, True]
  assert res.returns[:, 1].tolist() == [-10, 100, 100, 100]  # kept after it was solved
  assert res.final_returns.tolist() == [-10, 100] and res.final_successes.tolist() == [False, True]
  # reflections: both failed in trial 1, only variation 0 afterwards
  assert [len(c) for c in writer.calls] == [2, 1, 1, 1]
  assert [k for k, _ in res.reflections[0]] == [0, 1, 2, 3]
  assert [t for _, t in res.reflections[1]] == ["plan 1.1"]
  # prompts: trial 1 has no memory; trial k holds exactly the last 2 reflections, in order
  first = res.prompts[(0, 0)]
  assert rx.MEMORY_HEADER not in first and "Find the animal hidden in room 0." in first
  p4 = res.prompts[(3, 0)]
  assert p4.startswith(rx.MEMORY_HEADER + "\nTrial 2:\nplan 2.0\nTrial 3:\nplan 3.0\n\n")
  assert p4.count("Trial ") == 2 and "plan 1.0" not in p4
  assert res.prompts[(1, 1)].startswith(rx.MEMORY_HEADER + "\nTrial 1:\nplan 1.1\n\n")
  # the reflection chat of trial 4 shows the last 2 earlier plans
  assert "Trial #2: plan 2.0\nTrial #3: plan 3.0" in writer.calls[3][0][0]["content"]
  assert [c["trial"] for c in res.curve()] == [1, 2, 3, 4]
  assert res.curve()[-1]["success"] == 0.5 and res.curve()[2]["ran"] == 1
  assert F.param_bytes(params) == before


@pytest.mark.slow
def test_policy_writer_samples_reflections_without_touching_params():
  config, params = F.tiny_policy(1)
  before = F.param_bytes(params)
  from empo2_jax.model.tokenizer import load_tokenizer

  cfg = rx.ReflexionConfig(max_new_tokens=8)
  write = rx.policy_writer(params, config, load_tokenizer(), cfg, max_context=256)
  long = rx.reflection_messages("Task: t\n" + "Observation: a room. > look\n" * 200, [], 3, 10**6)
  texts = write([long, rx.reflection_messages("Task: t", [], 3, 100)], jax.random.PRNGKey(0))
  assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
  assert F.param_bytes(params) == before
  np.testing.assert_equal(len(write([], jax.random.PRNGKey(0))), 0)
