"""SGE (methods/sge.py): temperature classes, reflection, the two-phase sampler, and log-probs
under the temperature each token was drawn at (sampler, kernel and the update's old log-prob)
against numpy."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from empo2_jax.methods import sge
from empo2_jax.model import llama
from empo2_jax.rl.logprobs import naive_token_logprobs, token_logprobs
from tests.helpers.tiny_model import TINY

MODEL = TINY


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_group_temperatures_and_reflection_share():
  classes = ((1.0, 0.5), (1.3, 0.25), (1.6, 0.25))
  assert sge.group_temperatures(8, classes) == [1.0] * 4 + [1.3] * 2 + [1.6] * 2
  assert sge.group_temperatures(4, classes) == [1.0, 1.0, 1.3, 1.6]
  assert sge.group_temperatures(2, classes) == [1.0, 1.3]
  assert [j for j in range(8) if sge.reflects(j, 0.5)] == [1, 3, 5, 7]
  assert [j for j in range(8) if sge.reflects(j, 0.25)] == [3, 7]
  assert not any(sge.reflects(j, 0.0) for j in range(8))
  assert all(sge.reflects(j, 1.0) for j in range(8))
  assert sge.parse_temperatures("1.0:0.5, 1.3:0.25,1.6:0.25") == classes
  with pytest.raises(ValueError, match="sum to 1"):
    sge.SGEConfig(strategy_temperatures=((1.0, 0.5),))


def test_split_strategy_and_cut():
  assert sge.split_strategy("<strategy> go east </strategy> Right") == ("go east", "Right")
  assert sge.split_strategy("Right") == ("", "Right")
  assert sge.split_strategy("<strategy> go east and") == ("go east and", "")
  pieces = ["<str", "ategy>", " go", " </", "strategy", ">\n", "Right"]
  decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
  assert sge.close_cut(range(7), decode) == 6
  assert sge.close_cut(range(5), decode) is None


def test_strategy_book_recent_distinct_and_roundtrip():
  book = sge.StrategyBook(max_per_key=4)
  for s, ok in (("a", False), ("b", False), ("a", True), ("c", False), ("d", False)):
    book.add(("t", 1), s, ok, 10.0)
  book.add(("t", 1), "   ", True, 1.0)  # empty strategies are not stored
  # max_per_key=4 dropped the first "a"; the latest "a" outcome is a success
  assert [e["strategy"] for e in book.recent(("t", 1), 3)] == ["a", "c", "d"]
  assert book.recent(("t", 1), 3)[0]["success"] is True
  again = sge.StrategyBook.from_array(book.to_array(), max_per_key=4)
  assert again.entries == book.entries
  assert sge.StrategyBook().to_array().size > 0  # checkpointable even when empty
  text = sge.reflection_text(book.recent(("t", 1), 2), lambda s: f"{s:g}/100")
  assert "- c -> fail, score 10/100" in text and text.rstrip().endswith("likely to succeed.")


def test_sample_with_strategy_phases_with_a_fake_sampler():
  """Phase 1 per temperature class and cut at </strategy>; phase 2 continues prompt + kept ids
  at the action temperature; a row that stopped in phase 1 ends there."""
  calls = []
  text = {1: "<strategy>", 2: " x", 3: "</strategy>", 4: " y", 5: "Right", 9: "<eos>"}
  decode = lambda ids: "".join(text[i] for i in ids)  # noqa: E731

  def sample(rows, key, n, t):
    calls.append((sorted(rows), n, t, {i: list(r) for i, r in rows.items()}))
    out = {}
    for i in rows:
      if n == 6:  # strategy phase
        ids = [1, 2, 3, 4] if i != 2 else [1, 9]
      else:
        ids = [5, 9]
      out[i] = (np.array(ids), np.full(len(ids), -float(t)))
    return out

  reqs = {0: [7, 7], 1: [8], 2: [6]}
  got = sge.sample_with_strategy(
    sample,
    decode,
    reqs,
    {0: 1.0, 1: 1.6, 2: 1.6},
    jax.random.PRNGKey(0),
    strategy_max_new_tokens=6,
    max_new_tokens=10,
    action_temperature=0.7,
    stop_ids=[9],
  )
  assert [(c[0], c[1], c[2]) for c in calls] == [([0], 6, 1.0), ([1, 2], 6, 1.6), ([0, 1], 7, 0.7)]
  assert calls[2][3] == {0: [7, 7, 1, 2, 3], 1: [8, 1, 2, 3]}  # prompt + the kept strategy
  ids, lps, temps, closed = got[0]
  assert ids == [1, 2, 3, 5, 9] and closed
  assert temps == [1.0, 1.0, 1.0, 0.7, 0.7] and lps == [-1.0] * 3 + [-0.7] * 2
  assert got[1][2] == [1.6] * 3 + [0.7] * 2
  assert got[2][0] == [1, 9] and got[2][2] == [1.6, 1.6] and not got[2][3]


def test_token_logprobs_per_token_temperature_vs_numpy():
  rng = np.random.default_rng(0)
  h = rng.normal(size=(3, 5, 16)).astype(np.float32)
  w = rng.normal(size=(16, 37)).astype(np.float32)
  tgt = rng.integers(0, 37, (3, 5))
  temps = rng.choice([0.7, 1.0, 1.3, 1.6], size=(3, 5)).astype(np.float32)
  lp, ent = token_logprobs(
    jnp.asarray(h),
    jnp.asarray(w),
    jnp.asarray(tgt),
    chunk_size=8,
    with_entropy=True,
    inv_temperature=1.0 / temps,
  )
  ref = np_log_softmax((h @ w) / temps[..., None])
  want = np.take_along_axis(ref, tgt[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(lp), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), -(np.exp(ref) * ref).sum(-1), rtol=1e-4, atol=1e-5)

  def f(fn, hh, ww):
    a, b = fn(hh, ww, jnp.asarray(tgt), with_entropy=True, inv_temperature=1.0 / temps)
    return jnp.sum(a * 0.3) + jnp.sum(b * 0.7)

  chunked = jax.grad(
    lambda a, b: f(lambda *x, **k: token_logprobs(*x, chunk_size=8, **k), a, b), argnums=(0, 1)
  )(jnp.asarray(h), jnp.asarray(w))
  naive = jax.grad(lambda a, b: f(naive_token_logprobs, a, b), argnums=(0, 1))(
    jnp.asarray(h), jnp.asarray(w)
  )
  for a, b in zip(chunked, naive):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _reference_logprobs(params, seq, n_prompt, temps):
  """numpy: log softmax(logits / T_t)[token_t] for the tokens after the prompt."""
  logits = np.asarray(
    llama.forward(params, MODEL, jnp.asarray([seq]), jnp.ones((1, len(seq)), jnp.int32))
  )[0]
  out = []
  for j, t in enumerate(temps):
    pos = n_prompt + j
    out.append(np_log_softmax(logits[pos - 1] / t)[seq[pos]])
  return np.array(out)


@pytest.mark.slow
def test_session_two_phase_logprobs_are_under_the_temperature_used():
  """The real sampler: strategy tokens at T_s, action tokens at T_a; every returned log-prob is
  numpy's log softmax(logits / T) of the token's own temperature."""
  from empo2_jax.sampling.sampler import SamplerSettings
  from empo2_jax.sampling.session import Session

  params = llama.init_params(MODEL, jax.random.PRNGKey(1))
  session = Session(
    params,
    MODEL,
    num_rows=2,
    max_tokens=96,
    settings=SamplerSettings(cache_dtype="float32", prefill_chunks=(16, 64)),
  )

  def sample(rows, key, n, t):
    return session.step(rows, max_new_tokens=n, temperature=t, rng=key, stop_ids=[])

  prompts = {0: [3, 4, 5, 6], 1: [9, 8, 7]}
  got = sge.sample_with_strategy(
    sample,
    lambda ids: "",  # never closes: the full strategy budget, then the action phase
    prompts,
    {0: 1.6, 1: 1.3},
    jax.random.PRNGKey(2),
    strategy_max_new_tokens=5,
    max_new_tokens=9,
    action_temperature=0.8,
    stop_ids=[],
  )
  for i, prompt in prompts.items():
    ids, lps, temps, _ = got[i]
    assert len(ids) == 9 and temps == [{0: 1.6, 1: 1.3}[i]] * 5 + [0.8] * 4
    want = _reference_logprobs(params, prompt + ids, len(prompt), temps)
    np.testing.assert_allclose(lps, want, rtol=1e-4, atol=1e-4)
    wrong = _reference_logprobs(params, prompt + ids, len(prompt), [1.0] * 9)
    assert np.abs(np.array(lps) - wrong).max() > 1e-2  # the temperature matters


@pytest.mark.slow
def test_update_old_logprob_uses_each_tokens_temperature():
  """The update's old log-prob (the ratio's denominator) equals numpy's log softmax(logits / T)
  at the sampled token for per-token temperatures: sampler_logp is set to that reference, so
  the update's sampler-vs-old difference is ~0; without token temperatures it is not."""
  from empo2_jax.rl.update import init_train_state, make_optimizer, make_update_fn
  from tests.helpers.rl_settings import loss_config, update_config

  params = llama.init_params(MODEL, jax.random.PRNGKey(3))
  rng = np.random.default_rng(4)
  P, R, B = 6, 5, 4
  tokens = rng.integers(0, 512, (B, P + R)).astype(np.int32)
  temps = rng.choice([0.6, 1.0, 1.3, 1.6], size=(B, R)).astype(np.float32)
  ref = np.stack([_reference_logprobs(params, list(tokens[b]), P, temps[b]) for b in range(B)])
  batch = {
    "cur_tokens": tokens,
    "cur_attn": np.ones_like(tokens),
    "old_tokens": tokens,
    "old_attn": np.ones_like(tokens),
    "response_mask": np.ones((B, R), np.float32),
    "sampler_logp": ref.astype(np.float32),
    "advantages": rng.normal(size=B).astype(np.float32),
    "sample_index": np.arange(B, dtype=np.int32),
    "token_temperature": temps,
    # and a policy-shaping constant on one of the four turns: it reaches the loss
    "shaping_gamma": np.array([0.0, 1.0, 0.0, 0.0], np.float32),
  }
  cfg = update_config(
    lr=1e-3, minibatch_size=4, micro_rows=2, loss=loss_config(low_prob_mask=False)
  )
  opt = make_optimizer(cfg)
  update = make_update_fn(MODEL, cfg, opt, donate=False)
  _, met = update(init_train_state(params, opt), batch)
  assert float(met["sampler_vs_old_logp_absdiff"]) < 1e-4
  assert float(met["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)  # first step: old == current
  assert float(met["shaped_token_frac"]) == pytest.approx(0.25)
  no_temps = {k: v for k, v in batch.items() if k != "token_temperature"}
  _, met = update(init_train_state(params, opt), no_temps)
  assert float(met["sampler_vs_old_logp_absdiff"]) > 1e-2
