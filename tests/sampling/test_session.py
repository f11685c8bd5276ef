"""Multi-turn sessions: prefix reuse == full re-prefill, rollback, slot reuse, truncation policy."""

import numpy as np
import pytest

import jax

from empo2_jax.model import llama
from empo2_jax.model.configs import LlamaConfig
from empo2_jax.sampling.sampler import SamplerSettings, generate, get_engine
from empo2_jax.sampling.session import Session, common_prefix

CONFIG = LlamaConfig(
  vocab_size=256,
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  rope_theta=10000.0,
)
SETTINGS = SamplerSettings(cache_dtype="float32", prefill_chunks=(16, 64))
STOP = (7, 11, 13)  # common enough that responses end at different lengths


@pytest.fixture(scope="module")
def params():
  return llama.init_params(CONFIG, jax.random.key(0), std=0.3)


def test_common_prefix():
  a = np.array([1, 2, 3, 4])
  assert common_prefix(a, np.array([1, 2, 3, 4, 5])) == 4
  assert common_prefix(a, np.array([1, 2, 9])) == 2
  assert common_prefix(a, np.array([], np.int32)) == 0
  assert common_prefix(a, a) == 4


def test_prefix_reuse_equals_full_reprefill(params):
  """10 turns, 4 slots: episodes end at different turns, slot 3 starts a new episode, slot 0's
  early message is edited at turn 5 (rollback). Reuse and re-prefill must agree exactly."""
  rng = np.random.default_rng(0)
  kw = dict(num_rows=4, max_tokens=512)
  reuse = Session(params, CONFIG, settings=SETTINGS, **kw)
  full = Session(params, CONFIG, settings=SETTINGS, reuse_prefix=False, **kw)
  last_turn = {0: 9, 1: 4, 2: 7, 3: 2}
  hist = {s: rng.integers(0, 256, int(rng.integers(20, 60))).tolist() for s in range(4)}
  lengths = set()
  for turn in range(10):
    if turn == 3:  # slot 3: a new episode in a finished slot
      hist[3], last_turn[3] = rng.integers(0, 256, 45).tolist(), 9
    if turn == 5:  # tips rewritten in an earlier message of slot 0
      hist[0][10:13] = [1, 2, 3]
    req = {s: h for s, h in hist.items() if turn <= last_turn[s]}
    kwargs = dict(
      max_new_tokens=12, temperature=1.0, top_k=40, stop_ids=STOP, rng=jax.random.key(100 + turn)
    )
    a = reuse.step(req, **kwargs)
    b = full.step(req, **kwargs)
    assert sorted(a) == sorted(req)
    for s in req:
      np.testing.assert_array_equal(a[s][0], b[s][0])
      lengths.add(len(a[s][0]))
      np.testing.assert_allclose(a[s][1], b[s][1], atol=1e-5, rtol=0)
      assert reuse.cached_length(s) == len(req[s]) + len(a[s][0]) - 1
      hist[s] = hist[s] + a[s][0].tolist() + rng.integers(0, 256, int(rng.integers(3, 25))).tolist()
  assert reuse.stats["generated_tokens"] == full.stats["generated_tokens"]
  assert reuse.stats["prefill_tokens"] < full.stats["prefill_tokens"] / 3
  assert reuse.stats["rollbacks"] == 1 and reuse.stats["resets"] == 1, reuse.stats
  assert full.stats["reused_tokens"] == 0
  assert len(lengths) > 1  # stop ids end responses at different lengths


def test_session_compiles_bounded(params):
  engine = get_engine(CONFIG, SETTINGS)
  before = dict(engine.traces)
  sess = Session(params, CONFIG, num_rows=4, max_tokens=512, settings=SETTINGS)
  rng = np.random.default_rng(1)
  hist = {s: rng.integers(0, 256, int(rng.integers(1, 200))).tolist() for s in range(4)}
  for turn in range(6):
    out = sess.step(hist, max_new_tokens=8, temperature=0.9, rng=jax.random.key(turn))
    hist = {s: h + out[s][0].tolist() + [5] * int(rng.integers(1, 40)) for s, h in hist.items()}
  new = {k: engine.traces[k] - before.get(k, 0) for k in engine.traces}
  # one fixed cache shape: at most one prefill trace per chunk length, one decode per mode
  assert new.get("prefill", 0) <= 2 and new.get("decode", 0) <= 1, new


def test_truncation_policy(params):
  """Histories outgrow the cache: the session truncates (keep prefix + recent tail), never fails,
  truncates rarely thanks to the slack, and samples exactly what generate() gives on that view."""
  rng = np.random.default_rng(2)
  sess = Session(
    params, CONFIG, num_rows=2, max_tokens=160, keep_prefix=20, truncate_slack=48, settings=SETTINGS
  )
  hist = [rng.integers(0, 256, 60).tolist() for _ in range(2)]
  max_new = 10
  for turn in range(10):
    key = jax.random.key(turn)
    out = sess.step(
      {0: hist[0], 1: hist[1]}, max_new_tokens=max_new, temperature=1.0, stop_ids=STOP, rng=key
    )
    views = []
    for s in range(2):
      toks = out[s][0]
      view = sess.rows[s].view[: sess.cached_length(s) - (len(toks) - 1)].tolist()
      assert len(view) + max_new <= 160
      assert view[: min(20, len(view))] == hist[s][: min(20, len(view))]
      tail = len(view) - 20 if len(view) < len(hist[s]) else len(view)
      assert view[len(view) - tail :] == hist[s][len(hist[s]) - tail :]
      views.append(view)
    ref = generate(
      params,
      CONFIG,
      views,
      max_new_tokens=max_new,
      temperature=1.0,
      stop_ids=STOP,
      rng=key,
      settings=SETTINGS,
    )
    for s in range(2):
      np.testing.assert_array_equal(out[s][0], ref[s][0])
      np.testing.assert_allclose(out[s][1], ref[s][1], atol=1e-5, rtol=0)
      hist[s] = hist[s] + out[s][0].tolist() + rng.integers(0, 256, 30).tolist()
  assert max(len(h) for h in hist) > 400  # far past the 160-token cache
  assert 2 <= sess.stats["truncations"] <= 10, sess.stats  # amortised by the slack
  assert sess.stats["reused_tokens"] > 0


def test_prefill_of_a_row_subset_matches_a_plain_forward(params):
  """A chunk computes only the rows with new tokens (padded to a batch bucket) over a cache window;
  each busy row's final hidden state must equal a cache-free forward over its whole sequence, and
  idle rows keep theirs."""
  engine = get_engine(CONFIG, SETTINGS)
  b, s = 8, 512
  rng = np.random.default_rng(3)
  cache, hidden = engine.new_cache(b, s), engine.new_hidden(b)
  first = [rng.integers(0, 256, int(rng.integers(5, 90))).tolist() for _ in range(b)]
  cache, hidden, computed = engine.prefill(params, cache, hidden, first, np.zeros(b, np.int64))
  before = np.asarray(hidden).copy()
  busy = (1, 5)
  second = [rng.integers(0, 256, 30).tolist() if r in busy else None for r in range(b)]
  start = np.array([len(p) for p in first])
  traces = engine.traces["prefill_rows"]
  cache, hidden, computed = engine.prefill(params, cache, hidden, second, start)
  assert computed < b * 64  # fewer than all rows x the chunk
  assert engine.traces["prefill_rows"] >= traces  # (a trace may be cached from an earlier test)
  hidden = np.asarray(hidden)
  for r in range(b):
    if r not in busy:
      np.testing.assert_array_equal(hidden[r], before[r])
      continue
    seq = np.asarray([first[r] + second[r]], np.int32)
    ref = llama.forward(params, CONFIG, seq, np.ones_like(seq), return_hidden=True)
    np.testing.assert_allclose(hidden[r], np.asarray(ref)[0, -1], atol=1e-4, rtol=1e-4)
