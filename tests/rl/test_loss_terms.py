"""Loss terms (rl/loss_terms.py) against numpy: the context-distillation KL, OPID's token
advantage, the ratio figures; the teacher view's log-probs (train/teacher.py) against a direct
forward, and in the batch; a term registered from this file changes the update's loss. On a tiny
model: context distillation's update follows the exact full-vocabulary reverse-KL gradient, one
iteration moves the tip-free policy toward what the tips make likely, and empty tips move
nothing."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from empo2_jax.model import llama
from empo2_jax.rl import loss_terms, losses, teacher_terms
from empo2_jax.rl import update_grads as ug
from empo2_jax.rl import update_steps as steps
from empo2_jax.rl.update import init_train_state, make_update_fn
from tests.helpers.rl_settings import loss_config, update_config
from tests.helpers.tiny_model import TINY
from tests.rl.test_update import make_batch


def terms_cfg(**values):
  """LossConfig with the term keys set (the rest at the config's defaults)."""
  base = loss_config()
  terms = dict(base.terms)
  terms.update(values)
  return dataclasses.replace(base, low_prob_mask=False, terms=tuple(sorted(terms.items())))


def inputs(seed, N=6, R=5):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-2, 1, (N, R))
  old = logp + rng.normal(0, 0.5, (N, R))
  teacher = logp + rng.normal(0, 4, (N, R))  # some |d| beyond the clip of 10? no: up to ~12
  mask = (rng.random((N, R)) < 0.8).astype(np.float64)
  tmask = np.repeat((rng.random(N) < 0.7)[:, None], R, 1).astype(np.float64)
  adv = rng.normal(0, 1, N)
  return logp, old, teacher, mask, tmask, adv


def term_inputs(logp, old, teacher, mask, tmask, adv):
  f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  return loss_terms.TermInputs(
    logp=f(logp),
    old_logp=f(old),
    mask=f(mask),
    adv=f(adv),
    agg="token_mean",
    teacher_logp=f(teacher),
    teacher_mask=f(tmask),
  )


@pytest.mark.parametrize("baseline", [False, True])
def test_ctx_kl_value_gradient_and_estimate_match_numpy(baseline):
  """The surrogate is averaged over the teacher tokens (not the loss's tokens: its weight does
  not shrink with the share of samples that have a teacher view), the baseline is the old
  policy's clipped log-ratio averaged over the teacher tokens, the estimate is over them too."""
  logp, old, teacher, mask, tmask, adv = inputs(0)
  teacher[0, 0] = logp[0, 0] - 30.0  # beyond the clip
  cfg = terms_cfg(ctx_kl_coef=0.7, ctx_kl_clip=10.0, ctx_kl_baseline=baseline)
  m = (mask > 0) & (tmask > 0)
  assert 0 < m.sum() < mask.sum()  # some tokens without a teacher view
  d = np.clip(logp - teacher, -10, 10)
  if baseline:
    d = d - np.clip(old - teacher, -10, 10)[m].mean()
  want = np.sum(np.where(m, np.exp(logp - old) * d, 0)) / m.sum()
  want_grad = np.where(m, np.exp(logp - old) * d, 0) / m.sum()  # d is held fixed
  want_k1 = np.sum(np.where(m, logp - teacher, 0)) / m.sum()  # the estimate: never centred

  def f(lp):
    x = dataclasses.replace(term_inputs(logp, old, teacher, mask, tmask, adv), logp=lp)
    return teacher_terms.ctx_kl(x, cfg)

  (value, met), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(value, want, rtol=1e-5)
  np.testing.assert_allclose(g, want_grad, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(met["ctx_kl_k1"], want_k1, rtol=1e-5)
  np.testing.assert_allclose(met["ctx_kl_tokens"], m.sum() / mask.sum(), rtol=1e-6)
  # composed: the loss gains coef * value, the metric is logged
  x = term_inputs(logp, old, teacher, mask, tmask, adv)
  total, mets = loss_terms.add_terms(jnp.float32(1.5), {}, x, cfg)
  np.testing.assert_allclose(total, 1.5 + 0.7 * want, rtol=1e-5)
  assert {"ctx_kl", "ctx_kl_k1", "loss"} <= set(mets)


def test_ctx_kl_weight_does_not_shrink_with_the_teacher_share():
  """Samples without a teacher view added to a batch leave the term's value as it was."""
  logp, old, teacher, mask, tmask, adv = inputs(4)
  tmask[:] = 1.0
  cfg = terms_cfg(ctx_kl_coef=1.0)
  one = teacher_terms.ctx_kl(term_inputs(logp, old, teacher, mask, tmask, adv), cfg)[0]
  cat = lambda a, b: np.concatenate([a, b])  # noqa: E731
  doubled = term_inputs(
    cat(logp, logp), cat(old, old), cat(teacher, teacher), cat(mask, mask),
    cat(tmask, 0 * tmask), cat(adv, adv),
  )  # fmt: skip
  np.testing.assert_allclose(teacher_terms.ctx_kl(doubled, cfg)[0], one, rtol=1e-6)


def test_terms_without_their_inputs():
  """A teacher term on a batch without teacher views adds nothing (an iteration whose memory had
  nothing to retrieve); the KL to a reference without its log-probs is an error."""
  logp, old, teacher, mask, tmask, adv = inputs(1)
  x = dataclasses.replace(
    term_inputs(logp, old, teacher, mask, tmask, adv), teacher_logp=None, teacher_mask=None
  )
  loss, met = loss_terms.add_terms(jnp.float32(0.5), {}, x, terms_cfg(ctx_kl_coef=1.0))
  assert float(loss) == 0.5 and "ctx_kl" not in met
  adv_out, adv_met = loss_terms.token_advantages(x, terms_cfg(opid_coef=1.0))
  assert adv_out is x.adv and adv_met == {}
  with pytest.raises(ValueError, match="kl_coef"):
    loss_terms.add_terms(jnp.float32(0), {}, x, dataclasses.replace(terms_cfg(), kl_coef=0.1))


@pytest.mark.parametrize("norm", ["none", "std"])
def test_opid_token_advantage_matches_numpy_and_feeds_the_surrogate(norm):
  logp, old, teacher, mask, tmask, adv = inputs(2)
  cfg = terms_cfg(opid_coef=0.5, opid_norm=norm)
  x = term_inputs(logp, old, teacher, mask, tmask, adv)
  got, met = loss_terms.token_advantages(x, cfg)
  got = np.asarray(got)
  m = (mask > 0) & (tmask > 0)
  gain = np.where(m, teacher - old, 0.0)
  if norm == "std":
    gain = gain / gain[m].std()
  want = adv[:, None] + 0.5 * gain
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # its size is logged: mean |added| and mean |advantage| over the loss's tokens, the raw gain
  added = 0.5 * gain
  np.testing.assert_allclose(met["opid/abs_added"], np.abs(added)[mask > 0].mean(), rtol=1e-5)
  base = np.broadcast_to(adv[:, None], mask.shape)
  np.testing.assert_allclose(met["opid/abs_adv"], np.abs(base)[mask > 0].mean(), rtol=1e-5)
  np.testing.assert_allclose(met["opid/gain"], (teacher - old)[m].mean(), rtol=1e-5)
  # the policy loss reads them per token: equal to the clipped surrogate with those advantages
  pg, _ = losses.policy_loss(x.logp, x.old_logp, jnp.asarray(got), x.mask, cfg)
  r = np.exp(logp - old)
  tok = np.maximum(-want * r, -want * np.clip(r, 0.8, 1.3))
  tok = np.where(want < 0, np.minimum(tok, -want * 10.0), tok)
  np.testing.assert_allclose(pg, np.sum(tok * mask) / mask.sum(), rtol=1e-5)
  # off: the advantages come back untouched
  assert loss_terms.token_advantages(x, terms_cfg())[0] is x.adv


@pytest.mark.parametrize(
  "key,bad,match",
  [
    ("ctx_kl_clip", -1.0, "loss.ctx_kl_clip=-1.0 must be > 0"),
    ("ctx_kl_coef", -0.5, "loss.ctx_kl_coef=-0.5 must be >= 0"),
    ("opid_norm", "max", "loss.opid_norm='max'; valid: none, std"),
    ("opid_coef", -1.0, "loss.opid_coef=-1.0 must be >= 0"),
    ("kl_coef", -0.1, "loss.kl_coef=-0.1 must be >= 0"),
  ],
)
def test_term_values_are_checked_where_the_loss_settings_are_built(key, bad, match):
  from empo2_jax import defaults
  from empo2_jax.train import settings

  c = defaults.get_config()
  c.loss[key] = bad
  with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
    settings.loss_config(c)


@pytest.mark.parametrize("norm", ["none", "std"])
def test_gradient_accumulation_equals_one_batch_with_the_teacher_terms(norm):
  """One update of a batch with teacher views (ctx_kl with its baseline, OPID) in micro-batches
  of one row equals the same update in one micro-batch: params after an SGD step and the terms'
  metrics (the baseline, the denominators and OPID's normaliser are mini-batch statistics,
  update_grads.slot_stats)."""
  params = llama.init_params(TINY, jax.random.PRNGKey(0))
  batch = make_batch(0)
  rows, resp = batch["response_mask"].shape
  rng = np.random.default_rng(7)
  batch["teacher_logp"] = rng.normal(-3, 2, (rows, resp)).astype(np.float32)
  batch["teacher_mask"] = (np.arange(rows) % 2 == 0).astype(np.float32)
  batch = jax.tree.map(jnp.asarray, batch)
  lcfg = terms_cfg(ctx_kl_coef=1.0, ctx_kl_baseline=True, opid_coef=0.5, opid_norm=norm)
  out = {}
  for micro in (1, rows):
    cfg = update_config(micro_rows=micro, minibatch_size=rows, loss=lcfg)
    opt = optax.sgd(1.0)
    state = init_train_state(jax.tree.map(jnp.copy, params), opt)
    out[micro] = make_update_fn(TINY, cfg, opt)(state, batch)
  (one, m1), (whole, mw) = out[1], out[rows]
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(whole.params)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
  moved = sum(
    float(jnp.abs(a - b).sum()) for a, b in zip(*map(jax.tree.leaves, (whole.params, params)))
  )
  assert moved > 0
  for k in ("ctx_kl", "ctx_kl_k1", "opid/gain", "opid/abs_added", "loss"):
    np.testing.assert_allclose(float(m1[k]), float(mw[k]), rtol=1e-4, atol=1e-6, err_msg=k)


def test_ratio_figures_match_numpy_quantiles():
  rng = np.random.default_rng(3)
  N, R = 40, 8
  log_r = rng.normal(-0.5, 1.0, (N, R))
  old = rng.normal(-2, 1, (N, R))
  logp = old + log_r
  mask = (rng.random((N, R)) < 0.9).astype(np.float64)
  adv = rng.normal(0, 1, N)
  cfg = loss_config()
  half = N // 2  # two micro-batches: the sums add up
  parts = []
  for s in (slice(0, half), slice(half, N)):
    x = term_inputs(logp[s], old[s], logp[s], mask[s], mask[s], adv[s])
    parts.append(ug.ratio_measures(x, x.adv, cfg))
  summed = {k: parts[0][k] + parts[1][k] for k in parts[0]}
  figs = steps.ratio_figures(summed["_ratio_hist"], summed["_pos_n"], summed["_pos_low_n"])
  r = np.exp(log_r[mask > 0])
  width = 2 * ug.RATIO_HIST_MAX / ug.RATIO_HIST_BINS
  for q in (5, 50, 95):
    want = np.quantile(r, q / 100)
    assert abs(np.log(float(figs[f"ratio_p{q}"])) - np.log(want)) <= width
  pos = (mask > 0) & (adv[:, None] > 0)
  want_low = np.sum(pos & (log_r < np.log(1 - cfg.eps_low))) / np.sum(pos)
  np.testing.assert_allclose(figs["pos_adv_low_ratio"], want_low, rtol=1e-6)


def test_teacher_view_logprobs_equal_a_direct_forward():
  """train/teacher.score_teacher_views against a forward of the model on the chat WITH tips,
  tokenised as the sampler's prompts are; a teacher chat over max_prompt_len gets none."""
  from empo2_jax.model.tokenizer import load_tokenizer
  from empo2_jax.rl.batch import prompt_text
  from empo2_jax.rl.update import sample_logprobs_fn
  from empo2_jax.train.teacher import score_teacher_views
  from tests.helpers.rl_settings import batch_config
  from tests.rl.test_batch import TIP, make_turn

  tok = load_tokenizer()
  model = dataclasses.replace(TINY, vocab_size=len(tok))
  params = llama.init_params(model, jax.random.PRNGKey(0))
  turns = [make_turn(tok, i, "on", tip=False) for i in range(3)]
  for t in turns[:2]:
    t.teacher_messages = [dict(m) for m in t.messages]
    t.teacher_messages[-1]["content"] = TIP + t.teacher_messages[-1]["content"]
  turns[1].teacher_messages[-1]["content"] += " word" * 400  # over max_prompt_len below
  cfg = update_config(micro_rows=2, vocab_chunk=4096)
  stats = score_teacher_views(
    params, turns, tok, batch_config(max_prompt_len=300), sample_logprobs_fn(model, cfg)
  )
  assert stats == {"teacher/turns": 1.0, "teacher/dropped": 1.0}
  assert turns[1].teacher_logprobs is None and turns[2].teacher_logprobs is None
  ids = tok(prompt_text(tok, turns[0].teacher_messages), add_special_tokens=False)["input_ids"]
  seq = jnp.asarray([ids + turns[0].response_ids])
  logits = llama.forward(params, model, seq, jnp.ones(seq.shape, jnp.int32))
  lp = jax.nn.log_softmax(logits[0, len(ids) - 1 : -1] / cfg.temperature, -1)
  want = np.asarray(lp)[np.arange(len(turns[0].response_ids)), turns[0].response_ids]
  np.testing.assert_allclose(turns[0].teacher_logprobs, want, rtol=1e-4, atol=1e-5)


def test_batch_carries_teacher_logprobs_in_both_layouts():
  from empo2_jax.model.tokenizer import load_tokenizer
  from empo2_jax.rl import batch as batch_lib
  from tests.helpers.rl_settings import batch_config
  from tests.rl.test_batch import make_turn

  tok = load_tokenizer()
  turns = [make_turn(tok, i, "on", tip=False) for i in range(3)]
  turns[1].teacher_logprobs = [-1.0, -2.0, -3.0]
  for build in (batch_lib.build_batch, batch_lib.build_packed_batch):
    batch, _ = build(turns, np.zeros(3), tok, batch_config())
    lead = batch["sample_index"] == 1
    np.testing.assert_array_equal(batch["teacher_mask"], lead.astype(np.float32))
    np.testing.assert_array_equal(batch["teacher_logp"][lead][0][:3], [-1.0, -2.0, -3.0])
    assert not np.any(batch["teacher_logp"][~lead])


def test_a_term_registered_here_changes_the_update_loss():
  @loss_terms.register_loss_term("toy_sq", keys={"toy_sq_coef": 0.0})
  def toy_sq(x, cfg):
    return x.mean(x.logp**2), {"toy_sq_seen": x.token_mean(jnp.ones_like(x.logp))}

  try:
    params = llama.init_params(TINY, jax.random.PRNGKey(0))
    batch = jax.tree.map(jnp.asarray, make_batch(0))
    mets = {}
    for coef in (0.0, 0.25):
      cfg = update_config(
        micro_rows=2, minibatch_size=8, loss=terms_cfg(toy_sq_coef=coef)
      )  # a single mini-batch: its loss is measured before any step
      state = init_train_state(jax.tree.map(jnp.copy, params), optax.sgd(0.0))
      _, mets[coef] = make_update_fn(TINY, cfg, optax.sgd(0.0))(state, batch)
    np.testing.assert_allclose(float(mets[0.0]["toy_sq_seen"]), 1.0, rtol=1e-6)  # logged at coef 0
    np.testing.assert_allclose(
      float(mets[0.25]["loss"]) - float(mets[0.0]["loss"]),
      0.25 * float(mets[0.0]["toy_sq"]),
      rtol=1e-4,
    )
    assert float(mets[0.0]["toy_sq"]) > 0
  finally:
    del loss_terms.TERMS["toy_sq"]


# ------------------------------------------------------------- context distillation, tiny model
TIP, ANS0, N_ANS, X0, N_X, P_LEN = 7, 100, 16, 200, 16, 8


def _prompts(rng, xs, answers=None):
  """[n, P_LEN] tip-free prompts (x then filler tokens) or, with answers, the tips view: the
  first two filler positions hold TIP and the answer."""
  n = len(xs)
  tok = rng.integers(300, 500, (n, P_LEN))
  tok[:, 0] = xs
  if answers is not None:
    tok[:, 1], tok[:, 2] = TIP, answers
  return tok.astype(np.int32)


def _resp_logits(params, prompts):
  logits = llama.forward(params, TINY, jnp.asarray(prompts), jnp.ones(prompts.shape, jnp.int32))
  return jax.nn.log_softmax(logits[:, -1], -1)


def _pretrain(rng):
  """The tiny model taught two skills by plain cross-entropy: with a tip, answer the token after
  TIP (a copy); without one, answer some answer token (uniformly). It knows no x -> answer map."""
  params = llama.init_params(TINY, jax.random.PRNGKey(1))
  opt = optax.adam(3e-3)
  state = opt.init(params)

  @jax.jit
  def step(params, state, prompts, targets):
    def loss(p):
      lp = _resp_logits(p, prompts)
      return -jnp.mean(jnp.take_along_axis(lp, targets[:, None], -1))

    g = jax.grad(loss)(params)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state

  for _ in range(300):
    xs = rng.integers(X0, X0 + N_X, 64)
    a = rng.integers(ANS0, ANS0 + N_ANS, 64)
    with_tip = _prompts(rng, xs[:32], a[:32])
    without = _prompts(rng, xs[32:])
    prompts = np.concatenate([with_tip, without])
    params, state = step(params, state, jnp.asarray(prompts), jnp.asarray(a))
  return params


def _ctx_batch(params, rng, answer_of, rows, empty_tips, seed):
  """One ctx_distill batch as the trainer builds it: `rows` tip-free prompts, a response token
  each sampled from `params`, its log-prob under the tips view with those same weights (the
  teacher, fixed for the iteration; with empty tips the view is the prompt itself). Advantages
  0, so only the reverse-KL term moves the weights. Also returns the tip-free prompts and the
  teacher's full log-softmax, for the exact reference."""
  xs = rng.integers(X0, X0 + N_X, rows)
  student = _prompts(rng, xs)
  teacher = student.copy()
  if not empty_tips:
    teacher[:, 1], teacher[:, 2] = TIP, answer_of[xs - X0]
  y = np.asarray(jax.random.categorical(jax.random.PRNGKey(seed), _resp_logits(params, student)))
  cur = np.concatenate([student, y[:, None]], 1).astype(np.int32)
  ones = np.ones(cur.shape, np.int32)
  lt = _resp_logits(params, teacher)
  batch = {
    "cur_tokens": cur,
    "cur_attn": ones,
    "old_tokens": cur,
    "old_attn": ones,
    "teacher_logp": np.asarray(lt)[np.arange(rows), y][:, None].astype(np.float32),
    "teacher_mask": np.ones(rows, np.float32),
    "response_mask": np.ones((rows, 1), np.float32),
    "sampler_logp": np.zeros((rows, 1), np.float32),
    "advantages": np.zeros(rows, np.float32),
    "sample_index": np.arange(rows, dtype=np.int32),
  }
  return jax.tree.map(jnp.asarray, batch), student, lt


def _ctx_update(params, opt, batch, n):
  cfg = update_config(
    micro_rows=n, minibatch_size=n, vocab_chunk=512, loss=terms_cfg(ctx_kl_coef=1.0)
  )
  state = init_train_state(jax.tree.map(jnp.copy, params), opt)  # the update donates it
  state, met = make_update_fn(TINY, cfg, opt)(state, batch)
  return state.params, met


def _held_out(params, rng, answer_of, teacher_params=None):
  """On new prompts (new filler tokens): the tip-free log-prob of the answer the tip names, and
  the full-vocabulary KL(tip-free || with tip) at the response position, the tips view under
  `teacher_params` (default: the same weights)."""
  xs = np.arange(X0, X0 + N_X).repeat(4)
  student = _prompts(rng, xs)
  teacher = student.copy()
  teacher[:, 1], teacher[:, 2] = TIP, answer_of[xs - X0]
  tp = params if teacher_params is None else teacher_params
  ls = np.asarray(_resp_logits(params, student), np.float64)
  lt = np.asarray(_resp_logits(tp, teacher), np.float64)
  logp_answer = ls[np.arange(len(xs)), answer_of[xs - X0]].mean()
  kl = np.sum(np.exp(ls) * (ls - lt), -1).mean()
  return logp_answer, kl


@pytest.fixture(scope="module")
def taught():
  """The pre-trained tiny model and the x -> answer map its tips name."""
  answer_of = ANS0 + np.random.default_rng(1).permutation(N_ANS)
  params = _pretrain(np.random.default_rng(0))
  teacher_lp = np.asarray(
    _resp_logits(params, _prompts(np.random.default_rng(6), [X0], answer_of[:1]))
  )[0, answer_of[0]]
  assert teacher_lp > -1.0, "pre-training did not teach the copy"  # the teacher knows the answer
  assert _held_out(params, np.random.default_rng(5), answer_of)[0] < -2.0  # one of 16 without
  return params, answer_of


def _flat(tree):
  return jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])


def _sgd_gradient(params, batch, rows):
  """The update's gradient, flattened: one SGD step of rate 1 from params (params - new params),
  with the update's metrics."""
  new, met = _ctx_update(params, optax.sgd(1.0), batch, rows)
  return _flat(jax.tree.map(jnp.subtract, params, new)), met


@pytest.mark.slow
def test_ctx_distill_gradient_is_the_full_vocabulary_reverse_kl_gradient(taught):
  """The update's gradient (one SGD step of rate 1: params - new params) from one sampled token a
  prompt against the exact gradient of mean_prompts sum_y s(y) (log s(y) - log t(y)) over the
  whole vocabulary, the teacher t held fixed: the sampled estimator points the same way."""
  params, answer_of = taught
  rows = 4096
  norms = []
  for seed in (3, 4):
    batch, student, lt = _ctx_batch(
      params, np.random.default_rng(seed), answer_of, rows, empty_tips=False, seed=seed
    )
    g_est, met = _sgd_gradient(params, batch, rows)

    def exact_kl(p):
      ls = _resp_logits(p, jnp.asarray(student))
      return jnp.mean(jnp.sum(jnp.exp(ls) * (ls - lt), -1))

    g_ref = _flat(jax.grad(exact_kl)(params))
    cos = float(g_est @ g_ref / jnp.linalg.norm(g_est) / jnp.linalg.norm(g_ref))
    ratio = float(jnp.linalg.norm(g_est) / jnp.linalg.norm(g_ref))
    assert cos > 0.6 and 0.5 < ratio < 2.0, (seed, cos, ratio)
    # the logged estimate is the mean of log s - log t over the sampled tokens: the exact KL's
    np.testing.assert_allclose(float(met["ctx_kl_k1"]), float(exact_kl(params)), rtol=0.1)
    norms.append(float(jnp.linalg.norm(g_est)))

  batch, _, _ = _ctx_batch(params, np.random.default_rng(3), answer_of, rows, True, seed=3)
  g_empty, met0 = _sgd_gradient(params, batch, rows)
  g0 = float(jnp.linalg.norm(g_empty))
  # teacher = student: d is float noise (the teacher here is a full forward, the update's
  # log-probs are chunked), so is the gradient
  assert g0 < 1e-4 * min(norms), (g0, norms)
  assert abs(float(met0["ctx_kl_k1"])) < 1e-5


@pytest.mark.slow
def test_ctx_distill_steps_move_the_tip_free_policy_toward_the_tips(taught):
  """One iteration as the trainer runs it (the teacher fixed at the iteration's weights, 8 Adam
  steps of 512 sampled prompts): on held-out prompts the tip-free log-prob of the answer the tip
  names rises and the KL to the tips view falls; with empty tips nothing moves. One iteration
  only: over several, the tip-free updates also reach the tips view (the teacher), so the
  outcome no longer measures distillation alone."""
  params, answer_of = taught
  n, steps = 512, 8
  # eps 1e-4: with empty tips the gradients are float noise, which Adam's default eps would
  # scale up to lr-sized steps; the distillation gradients are orders of magnitude above it
  opt = optax.adam(1e-3, eps=1e-4)
  held = lambda p: _held_out(p, np.random.default_rng(5), answer_of, params)  # noqa: E731
  before = held(params)
  batch, _, _ = _ctx_batch(params, np.random.default_rng(2), answer_of, n * steps, False, seed=2)
  moved, met = _ctx_update(params, opt, batch, n)
  after = held(moved)
  assert after[0] > before[0] + 5e-3, (before, after)  # the tip-free answer became likelier
  assert after[1] < before[1] - 1e-2, (before, after)  # closer to the tips view
  same_w = _held_out(moved, np.random.default_rng(5), answer_of)  # tips view moved too
  assert same_w[1] < before[1] - 1e-2, (before, same_w)
  assert float(met["ctx_kl_k1"]) > 1.0

  batch, _, _ = _ctx_batch(params, np.random.default_rng(2), answer_of, n * steps, True, seed=2)
  same, met0 = _ctx_update(params, opt, batch, n)
  unchanged = held(same)
  # Adam scales the noise-sized gradients into small steps: a move, but a fraction of the
  # distillation's (measured 1e-4 and 1e-3 nats against 2e-2 and 3e-2)
  for i in (0, 1):
    assert abs(unchanged[i] - before[i]) < 0.2 * abs(after[i] - before[i]), (
      before,
      after,
      unchanged,
    )
  assert abs(float(met0["ctx_kl_k1"])) < 1e-3 * float(met["ctx_kl_k1"]), (met0, met)
