"""Old log-probs from the sampler (optim.old_logp_source="sampler", rl/update.py): where they apply,
how close they are to the recomputed ones on the real model, and that the update is unchanged.

Measured here (test_sampler_logprobs_match_recompute_on_smollm2): SmolLM2-135M-Instruct, fp32,
temperature 1, 4 chats x 4 turns of 32 sampled tokens through the multi-turn Session (prefix
reuse, as the actor samples), re-scored by the update's packed forward (rl/batch
.build_packed_batch's old view): max |sampler_logp - recomputed old_logp| = 3.1e-5 nats over 500
response tokens (mean 4.9e-6). Real ScienceWorld episodes (make train's config, an on_tips
iteration, the first mini-batch's check in the update): max 1.9e-5, mean 5e-6. The tolerance
rl/update.SAMPLER_LOGP_TOL = 1e-3 is ~30x the larger.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from configs import sciworld

from empo2_jax.model import llama
from empo2_jax.rl import batch as batch_lib
from empo2_jax.rl.packing import packed_response_logprobs
from empo2_jax.rl.update import (
  SAMPLER_LOGP_TOL,
  as_packed,
  init_train_state,
  make_update_fn,
  sample_logprobs_fn,
)
from empo2_jax.train import settings
from tests.helpers.rl_settings import batch_config, loss_config, update_config
from tests.helpers.tiny_model import TINY

MEASURED_MAX_ABSDIFF = 3.1e-5  # the SmolLM2 measurement above (nats)

MODEL = TINY


def test_trainer_keeps_the_sampler_within_the_tolerance_and_falls_back_past_it():
  """The trainer's check after an update (train/old_logp_source.OldLogpSource.check): a first
  mini-batch whose sampler log-probs differ from the recomputed ones by 10x the measured
  difference keeps the sampler; past SAMPLER_LOGP_TOL (or NaN) the run falls back to
  recomputing; an update that recomputed anyway (old_from_sampler 0) never triggers it."""
  from configs import sciworld

  from empo2_jax.train import settings
  from empo2_jax.train.old_logp_source import OldLogpSource

  c = sciworld.get_config("tiny")
  c.optim.old_logp_source = "sampler"

  def fallback(old_from_sampler, maxdiff):
    source = OldLogpSource(c, settings.update_config(c))
    upd = {"loss/old_from_sampler": old_from_sampler, "loss/sampler_vs_old_logp_maxdiff": maxdiff}
    source.check(0, upd)
    return source.fallback

  assert not fallback(1.0, MEASURED_MAX_ABSDIFF * 10)
  assert not fallback(1.0, SAMPLER_LOGP_TOL)
  assert fallback(1.0, SAMPLER_LOGP_TOL * 1.01)
  assert fallback(1.0, float("nan"))
  assert not fallback(0.0, SAMPLER_LOGP_TOL * 100)


@pytest.mark.slow
def test_sampler_logprobs_match_recompute_on_smollm2():
  """The sampler's log-probs of its own tokens vs the update's recomputed old log-probs (the
  packed old view the trainer builds), on the real model in fp32 at temperature 1."""
  from empo2_jax.model import gguf
  from empo2_jax.model.tokenizer import stop_ids
  from empo2_jax.sampling.sampler import SamplerSettings
  from empo2_jax.sampling.session import Session

  path = gguf.smollm2_gguf_path()
  config, params = gguf.load_gguf(path, dtype="float32")
  config = config.replace(compute_dtype="float32")
  tok = gguf.load_gguf_tokenizer(path)
  tasks = [
    "Your task is to find a non-living thing and put it in the green box. This room is called "
    "the kitchen. In it, you see: a fridge, a table with an apple, a sink, a door to the hallway.",
    "Your task is to boil water. This room is called the kitchen. You see a stove, a pot, a sink.",
    "Your task is to find an animal. This room is called the outside. You see a butterfly, a "
    "tree, a door to the greenhouse.",
    "Your task is to measure the temperature of the orange juice. You see a thermometer, a cup.",
  ]
  replies = ["You move to the hallway. You see a painting.", "Nothing happens.", "Done."]
  R = 32
  session = Session(
    params, config, num_rows=len(tasks), max_tokens=2048, settings=SamplerSettings("float32")
  )
  chats = [
    [{"role": "system", "content": "You are an agent in a text world. Answer with one action."}]
    + [{"role": "user", "content": t}]
    for t in tasks
  ]
  turns = []
  for k in range(len(replies) + 1):
    ids = {
      i: tok(batch_lib.prompt_text(tok, c), add_special_tokens=False)["input_ids"]
      for i, c in enumerate(chats)
    }
    out = session.step(
      ids, max_new_tokens=R, temperature=1.0, stop_ids=stop_ids(tok), rng=jax.random.key(k)
    )
    for i, (r, lp) in out.items():
      text = tok.decode(r, skip_special_tokens=True)
      turns.append(
        batch_lib.Turn(
          messages=list(chats[i]),
          response=text,
          response_ids=[int(x) for x in r],
          sampler_logprobs=[float(x) for x in lp],
          mode="on",
          group_id=0,
          rollout_id=i,
          step=k,
          episode_return=0.0,
        )
      )
      if k < len(replies):
        chats[i] = chats[i] + [
          {"role": "assistant", "content": text},
          {"role": "user", "content": replies[k]},
        ]
  cfg = batch_config(max_prompt_len=2000, response_len=R, pad_id=0, micro_rows=1)
  batch, stats = batch_lib.build_packed_batch(turns, np.zeros(len(turns)), tok, cfg)
  # packed: a turn whose re-tokenised chat does not extend its row starts a new one
  assert stats["n_samples"] == len(turns) and stats["packed_rows"] < len(turns)
  old = jax.jit(lambda p, t, a, s: packed_response_logprobs(p, config, t, a, s, R))(
    params, batch["old_tokens"], batch["old_attn"], batch["old_starts"]
  )
  real = batch["response_mask"] > 0
  diff = np.abs(np.asarray(old) - batch["sampler_logp"])[real]
  assert real.sum() > 200
  assert diff.max() <= SAMPLER_LOGP_TOL, diff.max()


def _on_policy_batch(params, seed=0, rows=8, P=10, R=4, noise=0.0):
  """A turn-layout batch whose old view is the current view (on-policy) and whose sampler_logp are
  the model's own log-probs (+ uniform noise of at most `noise` nats)."""
  rng = np.random.default_rng(seed)
  L = P + R
  tok = np.zeros((rows, L), np.int32)
  attn = np.zeros((rows, L), np.int32)
  mask = np.zeros((rows, R), np.float32)
  for b in range(rows):
    p, r = rng.integers(3, P + 1), rng.integers(1, R + 1) if b < rows - 1 else 0
    tok[b, P - p : P + r] = rng.integers(0, MODEL.vocab_size, p + r)
    attn[b, P - p : P + r] = 1
    mask[b, :r] = 1.0
  lp = sample_logprobs_fn(MODEL, update_config(micro_rows=1))(params, tok, attn, R)
  lp = np.asarray(lp) + rng.uniform(-noise, noise, (rows, R)).astype(np.float32)
  return {
    "cur_tokens": tok,
    "cur_attn": attn,
    "old_tokens": tok.copy(),
    "old_attn": attn.copy(),
    "response_mask": mask,
    "sampler_logp": np.where(mask > 0, lp, 0.0).astype(np.float32),
    "advantages": rng.normal(0, 1, rows).astype(np.float32),
    "sample_index": np.where(np.arange(rows) < rows - 1, np.arange(rows), -1).astype(np.int32),
  }


@pytest.mark.slow
def test_update_with_sampler_logprobs_equals_recompute():
  """Same batch, same start: the update that takes the sampler's log-probs (off by up to the
  measured 3.1e-5 nats) ends at the same params and metrics as the one that recomputes them; the
  sampler-mode update with old_from_sampler=False recomputes (bit-equal to recompute mode)."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  batch = jax.tree.map(jnp.asarray, _on_policy_batch(params, noise=MEASURED_MAX_ABSDIFF))
  opt = optax.sgd(0.05)  # Adam would amplify the tiny differences of near-zero gradients
  base = dict(minibatch_size=4, micro_rows=2, vocab_chunk=100, loss=loss_config(low_prob_delta=-30))
  rec_cfg = update_config(**base)
  smp_cfg = update_config(**base, old_logp_source="sampler")
  start = lambda: init_train_state(jax.tree.map(jnp.copy, params), opt)  # noqa: E731

  s_rec, m_rec = make_update_fn(MODEL, rec_cfg, opt, donate=False)(start(), batch)
  smp = make_update_fn(MODEL, smp_cfg, opt, donate=False)
  s_smp, m_smp = smp(start(), batch)  # old_from_sampler=None: True
  s_off, m_off = smp(start(), batch, None, jnp.bool_(False))

  assert float(m_rec["old_from_sampler"]) == 0.0 and float(m_off["old_from_sampler"]) == 0.0
  assert float(m_smp["old_from_sampler"]) == 1.0
  moved = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(s_rec.params), jax.tree.leaves(params))
  )
  assert moved > 1e-3
  for a, b, c in zip(*(jax.tree.leaves(s.params) for s in (s_rec, s_smp, s_off))):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)  # sgd step x tolerance-size ratio change
    np.testing.assert_array_equal(c, a)
  for k, v in m_rec.items():
    if k in ("old_from_sampler", "sampler_vs_old_logp_absdiff", "sampler_vs_old_logp_maxdiff"):
      continue
    if k == "per_sample":  # per-turn arrays (train/view_metrics.py), compared leaf by leaf
      for name, x in v.items():
        np.testing.assert_allclose(m_smp[k][name], x, rtol=1e-3, atol=1e-4, err_msg=name)
        np.testing.assert_array_equal(m_off[k][name], x, err_msg=name)
      continue
    np.testing.assert_allclose(m_smp[k], v, rtol=1e-3, atol=1e-4, err_msg=k)
    np.testing.assert_array_equal(m_off[k], v, err_msg=k)
  # The sampler-vs-recompute check: the whole batch when recomputed, the first mini-batch when
  # the sampler's log-probs were used; both see the injected noise and nothing more.
  for m in (m_rec, m_smp):
    assert 0 < float(m["sampler_vs_old_logp_maxdiff"]) <= MEASURED_MAX_ABSDIFF * 1.01 + 1e-6
    assert 0 < float(m["sampler_vs_old_logp_absdiff"]) <= float(m["sampler_vs_old_logp_maxdiff"])


def test_packed_batch_and_turn_batch_agree_in_sampler_mode():
  """as_packed: the turn layout's sampler_logp become [B, 1, R] and are used as they are."""
  params = llama.init_params(MODEL, jax.random.PRNGKey(1))
  batch = _on_policy_batch(params, seed=1)
  cfg = update_config(minibatch_size=8, micro_rows=2, old_logp_source="sampler")
  opt = optax.sgd(0.05)
  fn = make_update_fn(MODEL, cfg, opt, donate=False)
  a, ma = fn(init_train_state(params, opt), jax.tree.map(jnp.asarray, batch))
  b, mb = fn(init_train_state(params, opt), jax.tree.map(jnp.asarray, as_packed(batch)))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(x, y)
  assert float(ma["sampler_vs_old_logp_maxdiff"]) < 1e-5


def _cpu_config(**over):
  c = sciworld.get_config("cpu")
  c.unlock()
  for key, v in over.items():
    section, field = key.split(".")
    c[section][field] = v
  return c


def test_settings_pick_the_sampler_only_where_valid():
  """Static: fp32 sampling and update, temperature > 0, no top-k/top-p, no SGE/HeRL/SPA."""
  assert _cpu_config().optim.old_logp_source == "sampler"  # the default
  assert settings.old_logp_source(_cpu_config())[0] == "sampler"
  assert settings.update_config(_cpu_config()).old_logp_source == "sampler"
  for over in (
    {"optim.old_logp_source": "recompute"},
    {"model.compute_dtype": "bfloat16"},
    {"rollout.cache_dtype": "bfloat16"},
    {"rollout.top_p": 0.9},
    {"rollout.top_k": 20},
    {"rollout.temperature": 0.0},
    {"sge.enabled": True},
    {"herl.enabled": True},
    {"spa.enabled": True},
  ):
    c = _cpu_config(**over)
    assert settings.old_logp_source(c)[0] == "recompute", over
    assert settings.update_config(c).old_logp_source == "recompute", over
  with pytest.raises(ValueError, match="optim.old_logp_source='cache'"):
    settings.update_config(_cpu_config(**{"optim.old_logp_source": "cache"}))


def test_per_iteration_choice_keeps_recompute_off_policy_and_for_sge():
  """Dynamic: the paper's off-policy old view is tip-free (never sampled): recompute; the
  release variant's off-policy old view keeps the tips (sampled): sampler. Per-token
  temperatures or policy-shaping constants in the batch (rl/update.OPTIONAL_KEYS): recompute."""
  ok = settings.old_logp_from_sampler
  assert ok("on", "paper", {}) and ok("on_tips", "paper", {}) and ok("on_tips", "release", {})
  assert not ok("off", "paper", {})
  assert ok("off", "release", {})
  assert not ok("on", "paper", {"token_temperature": np.zeros((1, 1, 4))})
  assert not ok("on_tips", "paper", {"shaping_gamma": np.zeros((1, 1))})


def test_the_renamed_key_is_refused_with_its_new_name():
  """optim.old_logprobs became optim.old_logp_source (config_keys.RENAMED): a command-line
  override and a config that still sets the old key both name the new one."""
  from empo2_jax import preflight
  from empo2_jax.errors import UserError
  from empo2_jax.train.build import ConfigError, check_config

  with pytest.raises(UserError, match="renamed config key.*use --config.optim.old_logp_source"):
    preflight.check_overrides(["--config.optim.old_logprobs=recompute"], _cpu_config())
  preflight.check_overrides(["--config.optim.old_logp_source=recompute"], _cpu_config())
  with pytest.raises(
    ConfigError, match="optim.old_logprobs was renamed: set optim.old_logp_source"
  ):
    check_config(_cpu_config(**{"optim.old_logprobs": "recompute"}))
