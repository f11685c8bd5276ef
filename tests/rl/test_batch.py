"""Turns -> token batches: views per mode, tip removal at the message level, padding, dropping."""

import numpy as np
import pytest

from empo2_jax.model.tokenizer import load_tokenizer
from empo2_jax.rl import advantages as adv_lib
from tests.helpers.rl_settings import batch_config
from empo2_jax.rl.batch import (
  Turn,
  bucket_size,
  build_batch,
  prompt_text,
  views_for,
)
from empo2_jax.tips import strip_tips

turn_advantages = adv_lib.turn_advantages

TIP = (
  "<tip> Here are some memories you collected in your previous exploration:\nopen door\n</tip>\n"
)


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def make_turn(tok, i, mode, tip=True, n_resp=3, **kw):
  obs = f"You are in room {i}. "
  user = (obs + TIP + "Answer with one action.") if tip else (obs + "Answer with one action.")
  messages = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Task: find the animal. " + (TIP if tip else "")},
    {"role": "assistant", "content": "look around"},
    {"role": "user", "content": user},
  ]
  ids = tok(f" go to hall {i}", add_special_tokens=False)["input_ids"][:n_resp]
  base = dict(
    messages=messages,
    response=tok.decode(ids),
    response_ids=ids,
    sampler_logprobs=[-0.5 - 0.1 * j for j in range(len(ids))],
    mode=mode,
    group_id=i % 2,
    rollout_id=i,
    step=0,
    episode_return=float(i),
  )
  base.update(kw)
  return Turn(**base)


def test_strip_tips_gives_the_no_memory_message():
  assert strip_tips("obs\n" + TIP + "act") == "obs\nact"
  assert strip_tips("a <tip>x\ny</tip> b <tip>z</tip>") == "a  b "
  assert strip_tips("no tips here") == "no tips here"


def test_strip_tips_inverts_the_agents_tip_block():
  from empo2_jax.envs.scienceworld.prompts import step_user_message

  tips = [
    "the door is north; At that timestep, the specific action you took was open door",
    "second <memory>",
  ]
  assert strip_tips(step_user_message("a hallway", tips)) == step_user_message("a hallway")


def test_views_table():
  assert views_for("on", "paper") == ("tips", "tips")
  assert views_for("on_tips", "release") == ("tips", "tips")
  assert views_for("off", "paper") == ("notips", "notips")
  assert views_for("off", "release") == ("notips", "tips")
  with pytest.raises(ValueError, match="mode"):
    views_for("offline", "paper")
  with pytest.raises(ValueError, match="ratio_variant"):
    batch_config(ratio_variant="new")


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_build_batch_views_and_layout(tok, variant):
  turns = [
    make_turn(tok, 0, "off"),
    make_turn(tok, 1, "on_tips"),
    make_turn(tok, 2, "on", tip=False),
    make_turn(tok, 3, "off", n_resp=2),
  ]
  adv = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
  cfg = batch_config(
    max_prompt_len=512, response_len=8, ratio_variant=variant, prompt_multiple=16, micro_rows=4
  )
  batch, stats = build_batch(turns, adv, tok, cfg)
  rows, L = batch["cur_tokens"].shape
  P = L - 8
  assert rows == 4 and P % 16 == 0 and stats["n_samples"] == 4

  def prompt_ids(messages):
    return tok(prompt_text(tok, messages), add_special_tokens=False)["input_ids"]

  for row, t in enumerate(turns):
    stripped = [dict(m, content=m["content"].replace(TIP, "")) for m in t.messages]
    tips_ids, notips_ids = prompt_ids(t.messages), prompt_ids(stripped)
    if t.mode == "off":
      cur, old = notips_ids, (notips_ids if variant == "paper" else tips_ids)
      assert len(notips_ids) < len(tips_ids)
    else:
      cur = old = tips_ids
    n = len(t.response_ids)
    for prefix, want in (("cur", cur), ("old", old)):
      toks, attn = batch[f"{prefix}_tokens"][row], batch[f"{prefix}_attn"][row]
      np.testing.assert_array_equal(toks[P - len(want) : P], want)  # left-padded prompt
      np.testing.assert_array_equal(toks[P : P + n], t.response_ids)  # response as sampled
      np.testing.assert_array_equal(
        attn, np.r_[np.zeros(P - len(want)), np.ones(len(want) + n), np.zeros(8 - n)]
      )
    np.testing.assert_array_equal(batch["response_mask"][row], np.r_[np.ones(n), np.zeros(8 - n)])
    np.testing.assert_allclose(batch["sampler_logp"][row, :n], t.sampler_logprobs)
  np.testing.assert_array_equal(batch["advantages"], adv)
  np.testing.assert_array_equal(batch["sample_index"], [0, 1, 2, 3])
  # the tip-free view of the on-policy-with-tips turn is never used; the on turn has no tips
  assert prompt_ids(turns[2].messages) == list(
    batch["cur_tokens"][2, P - len(prompt_ids(turns[2].messages)) : P]
  )


def test_long_samples_dropped_and_rows_padded(tok):
  short = make_turn(tok, 0, "on")
  long_resp = make_turn(tok, 1, "on", n_resp=6)
  long_prompt = make_turn(tok, 2, "off")
  long_prompt.messages[-1]["content"] += " word" * 300
  turns = [short, long_resp, long_prompt, make_turn(tok, 3, "on")]
  cfg = batch_config(max_prompt_len=200, response_len=4, prompt_multiple=32, micro_rows=8)
  batch, stats = build_batch(turns, np.arange(4, dtype=np.float32), tok, cfg)
  assert stats["n_dropped_response"] == 1 and stats["n_dropped_prompt"] == 1
  assert stats["n_samples"] == 2 and stats["rows"] == 8
  np.testing.assert_array_equal(batch["sample_index"], [0, 3, -1, -1, -1, -1, -1, -1])
  np.testing.assert_array_equal(batch["advantages"][:2], [0.0, 3.0])
  assert batch["response_mask"][2:].sum() == 0 and batch["cur_attn"][2:].sum() == 0
  assert batch["cur_tokens"].shape[1] <= 200 + 4


def test_prompt_len_check_tip_free_measures_only_the_tip_free_view(tok):
  long_tip = (
    "<tip> Here are some memories you collected in your previous exploration:\n"
    + "open the door to the hallway and look around carefully\n" * 20
    + "</tip>\n"
  )

  def with_long_tips(i, mode, extra_words=0):
    t = make_turn(tok, i, mode, tip=False)
    t.messages[-1]["content"] = "You are here. " + long_tip + "Answer." + " word" * extra_words
    return t

  turns = [
    with_long_tips(0, "on_tips"),  # tips view long, tip-free view short
    with_long_tips(1, "off"),  # off: notips/notips, short
    with_long_tips(2, "off", 300),  # tip-free view itself long
    make_turn(tok, 3, "on", tip=False),
  ]
  turns[3].messages[-1]["content"] += " word" * 300  # no tips: the tip-free view is long
  adv = np.arange(4, dtype=np.float32)

  def full(t, view):
    return tok(
      prompt_text(
        tok,
        t.messages
        if view == "tips"
        else [dict(m, content=strip_tips(m["content"])) for m in t.messages],
      ),
      add_special_tokens=False,
    )["input_ids"]

  assert len(full(turns[0], "tips")) > 200 > len(full(turns[0], "notips"))
  for variant in ("paper", "release"):
    both = batch_config(
      max_prompt_len=200, response_len=4, prompt_multiple=32, ratio_variant=variant
    )
    tip_free = batch_config(
      max_prompt_len=200,
      response_len=4,
      prompt_multiple=32,
      ratio_variant=variant,
      prompt_len_check="tip_free",
    )
    _, s_both = build_batch(turns, adv, tok, both)
    batch, s_free = build_batch(turns, adv, tok, tip_free)
    # "both": the on_tips turn's with-tips view is too long; "release" off also reads the tips view
    assert s_both["n_dropped_prompt"] == (3 if variant == "paper" else 4)
    assert s_free["n_dropped_prompt"] == 2 and s_free["n_samples"] == 2
    np.testing.assert_array_equal(batch["sample_index"][:2], [0, 1])
    # the too-long with-tips view is kept whole: P grows past max_prompt_len to fit it
    p_len = batch["cur_tokens"].shape[1] - 4
    ids = full(turns[0], "tips")
    assert p_len >= len(ids) > 200
    np.testing.assert_array_equal(batch["cur_tokens"][0, p_len - len(ids) : p_len], ids)
    assert batch["cur_attn"][0, : p_len - len(ids)].sum() == 0
  with pytest.raises(ValueError, match="prompt_len_check"):
    batch_config(prompt_len_check="tips")


def test_bucket_sizes_are_few_and_tight():
  sizes = {bucket_size(n, 8, 1.25) for n in range(1, 4000)}
  assert len(sizes) < 40
  for n in range(1, 4000):
    b = bucket_size(n, 8, 1.25)
    assert b >= n and b % 8 == 0 and (b <= 16 or b <= 1.25 * n + 8)


def test_turn_advantages_dispatch(tok):
  turns = [
    make_turn(tok, i, "on", reward=float(i % 3), intrinsic=0.1 * i, obs_key=f"o{i % 2}", step=i % 3)
    for i in range(6)
  ]
  g = [t.group_id for t in turns]
  np.testing.assert_allclose(
    turn_advantages(turns, "grpo_step"),
    adv_lib.grpo_step_advantages(g, [float(i) for i in range(6)], [0.1 * i for i in range(6)]),
  )
  np.testing.assert_allclose(
    turn_advantages(turns, "grpo_rollout"),
    adv_lib.rollout_advantages(g, list(range(6)), [i % 3 + 0.1 * i for i in range(6)]),
  )
  got = turn_advantages(turns, "gigpo", use_std=False)
  assert got.shape == (6,) and np.all(np.isfinite(got))
  with pytest.raises(ValueError, match="estimator"):
    turn_advantages(turns, "ppo")
