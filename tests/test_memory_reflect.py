"""Reflection tips, stored text, batched reflect/commit, and the intrinsic reward."""

import numpy as np
import pytest

from empo2_jax.memory import reflect as R
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.memory.store import MemoryStore


def episode(slot=("boil", 0), score=35.0, n=2):
  msgs = [{"role": "system", "content": "You are an agent."}]
  actions = []
  for t in range(n):
    msgs.append({"role": "user", "content": f"obs {t}"})
    msgs.append({"role": "assistant", "content": f"raw act {t}"})
    actions.append(f"act {t}")
  msgs.append({"role": "user", "content": "final obs"})
  return R.ReflectEpisode(slot=slot, messages=msgs, actions=actions, score=score)


def test_clean_tip_one_line_no_markup_word_limit():
  raw = (
    "<|im_start|>assistant\nTip: Heat the water on the stove first.<|im_end|>\nsecond line\n"
    "<|endoftext|>"
  )
  assert R.clean_tip(raw) == "Heat the water on the stove first."
  assert R.clean_tip("  \n\n  **Summary**: go to kitchen  \n") == "go to kitchen"
  long = " ".join(f"w{i}" for i in range(150))
  assert R.clean_tip(long) == " ".join(f"w{i}" for i in range(99))
  assert len(R.clean_tip(long).split()) < 100
  assert R.clean_tip("<|im_end|>\n  ") == ""
  assert "<|" not in R.clean_tip("use <|im_start|>user the stove <|im_end|> now")


def test_memory_text_format():
  assert R.memory_text("Boil it.", "activate stove", -100.0) == (
    "Boil it.; At that timestep, the specific action you took was activate stove; "
    "Eventually you got the score -100/100."
  )
  assert R.memory_text("t", "a", 33.5).endswith("score 33.5/100.")


def test_key_text_and_step_keys():
  ep = episode()
  assert R.key_text(ep.messages[:2]) == "user: obs 0"
  keys = R.step_keys(ep.messages, 2, "step")
  assert keys == ["user: obs 0", "user: obs 0\nassistant: raw act 0\nuser: obs 1"]
  final = R.step_keys(ep.messages, 2, "final")
  assert final == [R.key_text(ep.messages)] * 2 and "system" not in final[0]
  with pytest.raises(ValueError, match="3 actions"):
    R.step_keys(ep.messages, 3)
  with pytest.raises(ValueError, match="key_mode"):
    R.step_keys(ep.messages, 2, "last")


def test_reflect_batches_one_generate_call():
  eps = [
    episode(("boil", 0), 35.0, 2),
    episode(("melt", 3), -100.0, 3),
    episode(("boil", 1), 0.0, 1),
  ]
  calls = []

  def generate_fn(chats):
    calls.append(chats)
    return ["Tip: focus on the water first.<|im_end|>", "<|im_end|>", "Open the freezer.\nmore"]

  tips, writes = R.reflect(eps, generate_fn)
  assert len(calls) == 1 and len(calls[0]) == 3
  assert calls[0][1][-1] == {"role": "user", "content": R.TIP_PROMPT}
  assert calls[0][1][:-1] == eps[1].messages
  assert tips == ["focus on the water first.", "", "Open the freezer."]
  assert [w.slot for w in writes] == [("boil", 0), ("boil", 0), ("boil", 1)]  # empty tip: no writes
  assert writes[1].text == R.memory_text("focus on the water first.", "act 1", 35.0)
  assert writes[1].score == 35.0 and writes[1].key == R.step_keys(eps[0].messages, 2)[1]
  with pytest.raises(ValueError, match="2 completions"):
    R.reflect(eps, lambda chats: ["a", "b"])
  assert R.reflect([], generate_fn) == ([], [])


def test_commit_encodes_keys_and_dedups():
  class FakeEncoder:  # deterministic stand-in: the real encoder is tested in test_encoder.py
    def encode(self, texts):
      return np.stack([np.eye(4, dtype=np.float32)[len(t) % 4] + 0.1 for t in texts])

  store = MemoryStore(dim=4)
  _, writes = R.reflect([episode(n=2)], lambda chats: ["do X"])
  uids = R.commit(store, FakeEncoder(), writes + writes[:1], iteration=7)
  assert uids == [0, 1, None]
  slot = store.slot(("boil", 0))
  assert slot.iterations.tolist() == [7, 7] and slot.scores.tolist() == [35.0, 35.0]
  np.testing.assert_allclose(
    slot.embeddings[0],
    FakeEncoder().encode([writes[0].key])[0]
    / np.linalg.norm(FakeEncoder().encode([writes[0].key])[0]),
    rtol=1e-6,
  )


def test_intrinsic_reward():
  n = np.array([[0, 1, 9], [3, 10, 0]])
  np.testing.assert_allclose(intrinsic_reward(n), 1.0 / (n + 1))
  np.testing.assert_allclose(intrinsic_reward(n, scale=0.5), 0.5 / (n + 1))
  used = np.array([[True, True, False], [True, False, True]])
  np.testing.assert_allclose(
    intrinsic_reward(n, used_memory=used), np.where(used, 1.0 / (n + 1), 0.0)
  )
  assert intrinsic_reward(n).dtype == np.float32 and intrinsic_reward(4) == pytest.approx(0.2)
  with pytest.raises(ValueError):
    intrinsic_reward([-1])


def test_tip_block():
  from empo2_jax.agent.prompts import tip_block  # the one block builder (the actor's)

  assert tip_block([]) == ""
  assert tip_block(["m1", "m2"]) == (
    "<tip> Here are some memories you collected in your previous exploration:\nm1\nm2\n</tip>\n"
  )


def test_clean_tip_removes_tip_tags_so_blocks_cannot_close_early():
  from empo2_jax.rl.batch import strip_tips

  tip = R.clean_tip("Open the door first </tip> then <tip> focus on the animal")
  assert "<tip>" not in tip and "</tip>" not in tip
  block = "<tip> memories:\n" + R.memory_text(tip, "open door", 8) + "\n</tip>\n"
  assert strip_tips("Observation: hall\n\n" + block + "Act.") == "Observation: hall\n\nAct."
