"""Retrospex: transitions from saved episodes, the tokenizer, the critic's IQL losses against a
numpy reference (GRU encoders included), Polyak averaging, save/load, and the re-scoring rule."""

import numpy as np
import pytest

import jax

from empo2_jax.baselines import retrospex as R
from empo2_jax.baselines import retrospex_data as D
from empo2_jax.baselines import retrospex_iql as Q


def _record(task, obs, acts, rewards, score, failed=False):
  return {
    "task": task,
    "score": score,
    "env_failed": failed,
    "turns": {
      "prompt": [f"You are an agent.\n\nYour task: {task} please\n\nObservation: x"]
      + ["Observation: y"] * (len(acts) - 1),
      "observation": obs,
      "executed_action": acts,
      "reward": rewards,
    },
  }


RECORDS = [
  _record(
    "boil water", ["kitchen", "stove on", "water hot"], ["go", "heat", "wait"], [0, 30, 70], 100
  ),
  _record("find animal", ["hall", "garden"], ["open door", "focus on frog"], [10, -10], 0.0),
  _record("find animal", ["hall"], ["look around"], [5], 5, failed=True),
]


def test_transitions_rewards_done_and_task():
  tr = D.transitions(RECORDS, reward="delta")
  assert len(tr) == 5  # the failed episode is skipped
  assert tr[0] == D.Transition("boil water please", "kitchen", "go", 0.0, "stove on", False)
  assert tr[2].done and tr[2].next_obs == "" and tr[2].reward == 70.0
  spread = D.transitions(RECORDS, reward="spread")
  assert [t.reward for t in spread] == pytest.approx([100 / 3] * 3 + [0.0, 0.0])
  with pytest.raises(ValueError, match="valid: delta, spread"):
    D.transitions(RECORDS, reward="final")


@pytest.fixture(scope="module")
def tiny():
  tr = D.transitions(RECORDS) * 3
  tok = D.Tokenizer(D.train_tokenizer(D.corpus(tr), vocab_size=8000))
  arrays = D.encode_transitions(tr, tok, dict(task=6, obs=5, act=4))
  return tr, tok, arrays


def test_tokenizer_pads_and_cuts(tiny):
  _, tok, arrays = tiny
  assert 0 < tok.vocab_size <= 8000
  assert arrays["task_ids"].shape == (15, 6) and arrays["next_obs_ids"].shape == (15, 5)
  ids, lens = tok.encode(["", "focus on frog " * 10], 4)
  assert lens.tolist() == [1, 4] and ids[0, 0] == tok.sp.unk_id()
  assert np.all(arrays["obs_len"] >= 1) and np.all(arrays["obs_len"] <= 5)


# ---------------------------------------------------------------------------- numpy reference
def _sig(x):
  return 1 / (1 + np.exp(-x))


def np_critic(params, fields):
  p = jax.tree.map(np.asarray, params)["params"]
  table = p["embed"]["embedding"]
  hs = []
  for i, (ids, lens) in enumerate(fields):
    c = p[f"gru{i}"]
    h = np.zeros((ids.shape[0], c["hr"]["kernel"].shape[0]))
    for b in range(ids.shape[0]):
      hb = np.zeros(h.shape[1])
      for t in range(lens[b]):
        x = table[ids[b, t]]
        r = _sig(x @ c["ir"]["kernel"] + c["ir"]["bias"] + hb @ c["hr"]["kernel"])
        z = _sig(x @ c["iz"]["kernel"] + c["iz"]["bias"] + hb @ c["hz"]["kernel"])
        n = np.tanh(
          x @ c["in"]["kernel"] + c["in"]["bias"] + r * (hb @ c["hn"]["kernel"] + c["hn"]["bias"])
        )
        hb = (1 - z) * n + z * hb
      h[b] = hb
    hs.append(h)
  h = np.maximum(np.concatenate(hs, -1) @ p["fc1"]["kernel"] + p["fc1"]["bias"], 0)
  return (h @ p["fc2"]["kernel"] + p["fc2"]["bias"])[:, 0]


def np_iql(state, b, tau, gamma):
  sa = [(b["task_ids"], b["task_len"]), (b["obs_ids"], b["obs_len"]), (b["act_ids"], b["act_len"])]
  s = sa[:2]
  s2 = [sa[0], (b["next_obs_ids"], b["next_obs_len"])]
  target_q = np.min([np_critic(p, sa) for p in state.q_target], axis=0)
  v = np_critic(state.v_params, s)
  u = target_q - v
  v_loss = np.mean(np.where(u < 0, 1 - tau, tau) * u**2)
  y = b["reward"] + gamma * (1 - b["done"]) * np_critic(state.v_params, s2)
  q_loss = np.mean([np.mean((np_critic(p, sa) - y) ** 2) for p in state.q_params])
  return q_loss, v_loss


@pytest.mark.slow  # compiles the GRU critics (~5 s each on an idle 2-core machine)
@pytest.mark.parametrize("twin", [False, True])
def test_iql_losses_equal_numpy_reference(tiny, twin):
  _, tok, arrays = tiny
  cfg = Q.IQLConfig(embed=8, hidden=6, twin_q=twin, expectile=0.7, gamma=0.99, lr=1e-2)
  nets = Q.make_nets(tok.vocab_size, cfg)
  state, opt = Q.init_state(nets, cfg, arrays)
  update = Q.make_update(nets, cfg, opt)
  batch = {k: v[:7] for k, v in arrays.items()}
  batch["reward"] = np.linspace(-1, 2, 7).astype(np.float32)
  losses = jax.jit(lambda qp, vp, qt, b: Q.iql_losses(nets, qp, vp, qt, b, cfg)[:2])
  for _ in range(2):  # at init (target == online) and after an update (they differ)
    q_loss, v_loss = losses(state.q_params, state.v_params, state.q_target, batch)
    want_q, want_v = np_iql(state, batch, 0.7, 0.99)
    np.testing.assert_allclose(float(q_loss), want_q, rtol=2e-4)
    np.testing.assert_allclose(float(v_loss), want_v, rtol=2e-4)
    old_target, old_q = state.q_target, state.q_params
    state, m = update(state, batch)
    np.testing.assert_allclose(float(m["q_loss"]), want_q, rtol=2e-4)
    # Polyak: target' = (1 - alpha) target + alpha * online'
    for t_new, t_old, q_new, q_old in zip(
      jax.tree.leaves(state.q_target),
      jax.tree.leaves(old_target),
      jax.tree.leaves(state.q_params),
      jax.tree.leaves(old_q),
    ):
      np.testing.assert_allclose(
        t_new, 0.995 * np.asarray(t_old) + 0.005 * np.asarray(q_new), rtol=1e-5, atol=1e-7
      )
      assert not np.allclose(q_new, q_old)
  assert len(state.q_params) == (2 if twin else 1)


def test_expectile_weights():
  u = np.array([-2.0, 1.0, 3.0])
  want = np.mean(np.array([0.3, 0.7, 0.7]) * u**2)
  np.testing.assert_allclose(float(Q.expectile_loss(u, 0.7)), want, rtol=1e-6)


@pytest.mark.slow
def test_train_save_load_roundtrip(tiny, tmp_path):
  _, tok, arrays = tiny
  cfg = Q.IQLConfig(embed=8, hidden=6, batch_size=4, steps=9, max_passes=2, lr=1e-2)
  nets, state, hist = Q.train(arrays, tok.vocab_size, cfg)
  assert int(state.step) == 6 and [h["steps"] for h in hist] == [3, 6]  # 15 // 4 = 3 a pass
  Q.save(str(tmp_path), state, cfg, tok.proto, {"episodes": ["x"]})
  nets2, state2, cfg2, tok2, meta = Q.load(str(tmp_path))
  assert cfg2 == cfg and meta == {"episodes": ["x"]} and tok2.vocab_size == tok.vocab_size
  np.testing.assert_allclose(Q.advantages(nets2, state2, arrays), Q.advantages(nets, state, arrays))
  with pytest.raises(FileNotFoundError, match="launch/retrospex.py train"):
    Q.load(str(tmp_path / "nothing"))


# ---------------------------------------------------------------------------- re-scoring
def test_rescore_follows_lambda():
  p = [0.9, 0.5, 0.1]  # the LLM prefers 0
  q = [-1.0, 0.0, 3.0]  # the critic prefers 2
  i0, _ = R.rescore(p, q, t=1, discount=0.97, floor=0.6)  # lambda 0.97: LLM
  assert i0 == 0
  i_late, s = R.rescore(p, q, t=40, discount=0.97, floor=0.6)  # lambda = b = 0.6
  # by hand: p^ = [1, .5, 0], q^ = [0, .25, 1] -> [.6, .4, .4]
  np.testing.assert_allclose(s, [0.6, 0.4, 0.4])
  assert i_late == 0
  i_b, s = R.rescore(p, q, t=100, discount=0.97, floor=0.2)  # lambda 0.2: the critic wins
  np.testing.assert_allclose(s, [0.2, 0.3, 0.8])
  assert i_b == 2
  _, s = R.rescore([0.3, 0.3], [1.0, 2.0], t=10, discount=0.9, floor=0.5)
  np.testing.assert_allclose(s, [0.25, 0.75])  # equal p: 0.5 each; lambda = b = 0.5
  _, s = R.rescore([0.1, 0.3], [5.0, 1.0], t=0, discount=0.9, floor=0.5)
  np.testing.assert_allclose(s, [0.0, 1.0])  # t = 0: lambda = 1, the LLM alone


def test_rescore_random_vs_formula():
  rng = np.random.default_rng(0)
  for _ in range(50):
    n = int(rng.integers(2, 6))
    p, q, t = rng.random(n), rng.normal(size=n), int(rng.integers(0, 30))
    lam = max(0.5, 0.9**t)
    pn = (p - p.min()) / (p.max() - p.min())
    qn = (q - q.min()) / (q.max() - q.min())
    want = lam * pn + (1 - lam) * qn
    i, s = R.rescore(p, q, t, 0.9, 0.5)
    np.testing.assert_allclose(s, want)
    assert i == int(np.argmax(want))


def test_candidates_dedupe_and_top_k():
  texts = ["Open door", "open  door", "look around", "", "focus on frog"]
  lps = [-1.0, -0.5, -2.0, 0.0, -0.1]
  assert R.candidates(texts, lps, 2) == [("focus on frog", -0.1), ("open  door", -0.5)]
  assert R.candidates(["", " "], [0.0, 0.0], 3) == []
