"""Reflection tips, stored text, the memory writes of an episode, and the intrinsic reward."""

import numpy as np
import pytest

from empo2_jax.memory import reflect as R
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.tips import clean_tip


def test_clean_tip_one_line_no_markup_word_limit():
  raw = (
    "<|im_start|>assistant\nTip: Heat the water on the stove first.<|im_end|>\nsecond line\n"
    "<|endoftext|>"
  )
  assert clean_tip(raw) == "Heat the water on the stove first."
  assert clean_tip("  \n\n  **Summary**: go to kitchen  \n") == "go to kitchen"
  long = " ".join(f"w{i}" for i in range(150))
  assert clean_tip(long) == " ".join(f"w{i}" for i in range(99))
  assert len(clean_tip(long).split()) < 100
  assert clean_tip("<|im_end|>\n  ") == ""
  assert "<|" not in clean_tip("use <|im_start|>user the stove <|im_end|> now")


def test_memory_text_format():
  assert R.memory_text("Boil it.", "activate stove", -100.0) == (
    "Boil it.; At that timestep, the specific action you took was activate stove; "
    "Eventually you got the score -100/100."
  )
  assert R.memory_text("t", "a", 33.5).endswith("score 33.5/100.")


def test_memory_writes_one_per_executed_step_none_for_an_empty_tip():
  writes = R.memory_writes(("boil", 0), "Heat it.", ["act 0", "act 1"], ["k0", "k1"], 35.0)
  assert writes == [
    R.MemoryWrite(("boil", 0), R.memory_text("Heat it.", "act 0", 35.0), 35.0, "k0"),
    R.MemoryWrite(("boil", 0), R.memory_text("Heat it.", "act 1", 35.0), 35.0, "k1"),
  ]
  assert R.memory_writes(("boil", 0), "", ["act 0"], ["k0"], 35.0) == []
  # a return without a maximum (score_out_of None) is stored without "/100"
  (w,) = R.memory_writes(("lake", 2), "Go left.", ["left"], ["k"], 0.5, out_of=None)
  assert w.text.endswith("Eventually you got the score 0.5.")


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
  from empo2_jax.tips import tip_block  # the one block builder

  assert tip_block([]) == ""
  assert tip_block(["m1", "m2"]) == (
    "<tip> Here are some memories you collected in your previous exploration:\nm1\nm2\n</tip>\n"
  )


def test_clean_tip_removes_tip_tags_so_blocks_cannot_close_early():
  from empo2_jax.tips import strip_tips

  tip = clean_tip("Open the door first </tip> then <tip> focus on the animal")
  assert "<tip>" not in tip and "</tip>" not in tip
  block = "<tip> memories:\n" + R.memory_text(tip, "open door", 8) + "\n</tip>\n"
  assert strip_tips("Observation: hall\n\n" + block + "Act.") == "Observation: hall\n\nAct."
