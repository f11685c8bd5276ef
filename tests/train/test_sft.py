"""SFT on gold chats: packing, answer masks, the loss against a naive per-turn reference,
learning."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.envs.fewshot import GoldTrajectory, PromptMaterial
from empo2_jax.model import configs as model_configs
from empo2_jax.model import llama
from empo2_jax.model.tokenizer import load_tokenizer, stop_ids
from empo2_jax.programs import train_lm
from empo2_jax.rl.packing import pack_turns
from empo2_jax.rl.update import init_train_state, make_optimizer
from empo2_jax.train import sft
from tests.helpers.numerics import assert_sums_close


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def _material():
  return PromptMaterial(
    task_description="Find an animal and focus on it.",
    action_templates=("look around", "go to LOC", "focus on OBJ"),
    inventory="nothing",
    focus_items=("cat", "dog"),
    few_shot=(),
  )


def _traj(n=3, variation=1):
  steps = tuple(
    (a, f"You did {a}. Room {variation}.")
    for a in ["look around", "go to hallway", "focus on cat", "wait", "look around"][:n]
  )
  return GoldTrajectory(
    task="find-animal",
    variation=variation,
    task_description="Find an animal and focus on it.",
    first_observation=f"This room is the kitchen {variation}.",
    steps=steps,
    final_score=100,
  )


def test_pack_turns_joins_extending_prompts_and_splits_where_the_prefix_breaks():
  prompts = [[1, 2], [1, 2, 7, 8, 3], [9, 9], [9, 9, 5, 6]]
  resps = [[7, 8], [4], [5, 6], [0]]
  rows = pack_turns(prompts, resps)
  assert [r.tokens for r in rows] == [[1, 2, 7, 8, 3, 4], [9, 9, 5, 6, 0]]
  assert rows[0].spans == [(2, 2), (5, 1)] and rows[0].turn_ids == [0, 1]
  assert rows[1].spans == [(2, 2), (4, 1)] and rows[1].turn_ids == [2, 3]
  for row in rows:  # every span's context is exactly that turn's prompt
    for (s, n), t in zip(row.spans, row.turn_ids):
      assert row.tokens[:s] == prompts[t] and row.tokens[s : s + n] == resps[t]
  with pytest.raises(ValueError, match="responses"):
    pack_turns([[1]], [])


def test_gold_chat_is_the_actors_chat(tok):
  from empo2_jax.envs.scienceworld import prompts

  chat = sft.gold_chat(_material(), _traj(3))
  assert [m["role"] for m in chat] == [
    "user",
    "assistant",
    "user",
    "assistant",
    "user",
    "assistant",
  ]
  assert chat[0]["content"] == prompts.first_user_message(_material(), _traj().first_observation)
  assert chat[2]["content"] == prompts.step_user_message("You did look around. Room 1.")
  assert [m["content"] for m in chat[1::2]] == ["look around", "go to hallway", "focus on cat"]
  assert len(sft.gold_chat(_material(), _traj(3), max_turns=2)) == 4


def test_chat_rows_pack_one_row_per_episode_with_answer_masks(tok):
  chats = [sft.gold_chat(_material(), _traj(3, v)) for v in (1, 2)]
  rows = sft.chat_rows(tok, chats, max_len=10_000)
  assert len(rows) == 2 and all(len(r.spans) == 3 for r in rows)
  stops = set(stop_ids(tok))
  for r in rows:
    answers = [r.tokens[s : s + n] for s, n in r.spans]
    assert [tok.decode(a[:-1]) for a in answers] == ["look around", "go to hallway", "focus on cat"]
    assert all(a[-1] in stops for a in answers)
  # Each turn's prompt is exactly what the actor feeds the sampler.
  prompts_, _ = sft.chat_turns(tok, chats[0])
  for (s, _), p in zip(rows[0].spans, prompts_):
    assert rows[0].tokens[:s] == p
  # max_len drops the turns that do not fit (and everything after them).
  cut = sft.chat_rows(tok, chats, max_len=rows[0].spans[1][0] + rows[0].spans[1][1])
  assert len(cut[0].spans) == 2 and len(cut[0].tokens) == sum(rows[0].spans[1])
  batch = sft.pad_rows(rows, tok.pad_token_id, bucket=64)
  assert batch["tokens"].shape[1] % 64 == 0
  assert batch["loss_mask"].sum() == sum(n for r in rows for _, n in r.spans)
  assert np.all(batch["loss_mask"] <= batch["attn"])


def _tiny(vocab):
  cfg = model_configs.get_preset("tiny", vocab_size=vocab)
  return cfg, llama.init_params(cfg, jax.random.PRNGKey(3), std=0.1)


def test_answer_nll_equals_naive_per_turn_log_softmax():
  """Packed-row NLL (programs/train_lm.next_token_nll with the answer mask) == the sum over turns
  of -log softmax on each turn's own (unpacked) row."""
  cfg, params = _tiny(300)
  rng = np.random.default_rng(0)
  p0 = list(rng.integers(0, 300, 7))
  r0 = list(rng.integers(0, 300, 3))
  p1 = p0 + r0 + list(rng.integers(0, 300, 4))
  r1 = list(rng.integers(0, 300, 2))
  (row,) = pack_turns([p0, p1], [r0, r1])
  batch = sft.pad_rows([row], 0, bucket=8)
  nll, count = train_lm.next_token_nll(
    params, cfg, batch["tokens"], batch["attn"], batch["loss_mask"], vocab_chunk=128
  )
  ref = 0.0
  for p, r in ((p0, r0), (p1, r1)):
    toks = np.array([p + r], np.int32)
    logits = np.asarray(llama.forward(params, cfg, toks, np.ones_like(toks)), np.float64)[0]
    logp = (
      logits
      - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
      - logits.max(-1, keepdims=True)
    )
    ref -= sum(logp[len(p) - 1 + j, r[j]] for j in range(len(r)))
  assert float(count) == 5
  np.testing.assert_allclose(float(nll), ref, rtol=1e-5)
  # the 15 positions in chunks of 4 (the last one padded): the same sum in another order
  chunked, count4 = train_lm.next_token_nll(
    params, cfg, batch["tokens"], batch["attn"], batch["loss_mask"], 128, token_chunk=4
  )
  assert float(count4) == 5
  np.testing.assert_allclose(float(chunked), float(nll), rtol=1e-6)


def test_without_a_loss_mask_every_real_token_after_a_real_one_is_scored():
  attn = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]], jnp.int32)
  want = [[0, 0, 0, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 1, 0]]
  np.testing.assert_array_equal(train_lm.next_token_scores(attn), want)


def test_sft_steps_lower_the_answer_loss_and_micro_batches_match_one_batch(tok):
  chats = [sft.gold_chat(_material(), _traj(3, v)) for v in (1, 2)]
  batch = sft.pad_rows(sft.chat_rows(tok, chats, 10_000), tok.pad_token_id, bucket=64)
  # The gold chats' rows with their token ids renumbered 0..n-1: a 512-token vocabulary instead of
  # Qwen's 151,936 (the logits of the full one made this test take a minute).
  ids, compact = np.unique(batch["tokens"], return_inverse=True)
  assert ids.size <= 512
  batch = dict(batch, tokens=compact.reshape(batch["tokens"].shape).astype(np.int32))
  cfg, params = _tiny(512)
  scfg = sft.SFTConfig(lr=1e-2, micro_rows=1)
  evaluate = sft.make_eval_loss(cfg, scfg)
  before = float(evaluate(params, batch))
  opt = make_optimizer(scfg)
  one = sft.make_sft_step(cfg, sft.SFTConfig(lr=1e-2, micro_rows=2))
  two = sft.make_sft_step(cfg, scfg)
  s1, m1 = one(init_train_state(jax.tree.map(jnp.copy, params), opt), batch)
  s2, m2 = two(init_train_state(jax.tree.map(jnp.copy, params), opt), batch)
  np.testing.assert_allclose(float(m1["loss"]), before, rtol=1e-5)
  np.testing.assert_allclose(float(m2["loss"]), float(m1["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(m2["grad_norm"]), float(m1["grad_norm"]), rtol=1e-4)
  state = s2
  for _ in range(8):
    state, _ = two(state, batch)
  after = float(evaluate(state.params, batch))
  assert after < 0.5 * before, (before, after)


def test_packed_logprobs_and_gradients_equal_the_per_turn_layout():
  """One packed row per episode == one left-padded row per turn (rl/logprobs.response_logprobs),
  for values (at 1e-5) and for the gradient of a weighted sum (at float32 rounding of a sum over
  the token positions, tests/helpers/numerics.py)."""
  from empo2_jax.rl.logprobs import response_logprobs
  from empo2_jax.rl.packing import packed_response_logprobs

  cfg, params = _tiny(300)
  rng = np.random.default_rng(1)
  R = 4
  episodes = []
  for n_turns in (3, 2):
    prompts_, resps, prompt = [], [], list(rng.integers(0, 300, 5))
    for t in range(n_turns):
      resp = list(rng.integers(0, 300, int(rng.integers(1, R + 1))))
      prompts_.append(prompt)
      resps.append(resp)
      prompt = prompt + resp + list(rng.integers(0, 300, 3))
    episodes.append((prompts_, resps))
  rows = [pack_turns(*e)[0] for e in episodes]
  batch = sft.pad_rows(rows, 0, bucket=8)
  T = 3
  starts = np.ones((2, T), np.int32)
  weights = np.zeros((2, T, R), np.float32)
  for b, r in enumerate(rows):
    for t, (s, n) in enumerate(r.spans):
      starts[b, t] = s
      weights[b, t, :n] = rng.normal(size=n)
  # Per-turn layout: prompt left-padded to P, response right-padded to R.
  turns = [(p, r) for e in episodes for p, r in zip(*e)]
  P = max(len(p) for p, _ in turns)
  tok = np.zeros((len(turns), P + R), np.int32)
  att = np.zeros_like(tok)
  for i, (p, r) in enumerate(turns):
    tok[i, P - len(p) : P], att[i, P - len(p) : P] = p, 1
    tok[i, P : P + len(r)], att[i, P : P + len(r)] = r, 1
  w_turn = np.concatenate([weights[0, :3], weights[1, :2]])

  def packed(p):
    lp = packed_response_logprobs(p, cfg, batch["tokens"], batch["attn"], starts, R, chunk_size=128)
    return jnp.sum(jnp.where(weights != 0, lp, 0.0) * weights), lp

  def per_turn(p):
    lp = response_logprobs(p, cfg, tok, att, R, chunk_size=128)
    return jnp.sum(jnp.where(w_turn != 0, lp, 0.0) * w_turn), lp

  (v1, lp1), g1 = jax.value_and_grad(packed, has_aux=True)(params)
  (v2, lp2), g2 = jax.value_and_grad(per_turn, has_aux=True)(params)
  lp1 = np.concatenate([np.asarray(lp1)[0, :3], np.asarray(lp1)[1, :2]])
  np.testing.assert_allclose(
    np.where(w_turn != 0, lp1, 0), np.where(w_turn != 0, lp2, 0), atol=1e-5
  )
  np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)
  # Each weight's gradient sums over the token positions; the two layouts sum in other orders
  # (observed: up to ~13 float32 eps of the leaf's largest entry, seeds 0-5).
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    assert_sums_close(a, b, n_terms=tok.size)
