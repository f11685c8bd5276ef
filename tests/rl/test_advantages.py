"""Advantages vs plain-python references on random episode batches."""

import numpy as np
import pytest

from empo2_jax.rl import advantages as A


def random_batch(seed, n_groups=3, n=4, max_len=5, n_obs=3):
  """Flat per-turn arrays, shuffled so that no function may rely on order."""
  rng = np.random.default_rng(seed)
  rows = []
  rid = 0
  for g in range(n_groups):
    for _ in range(n):
      length = int(rng.integers(1, max_len + 1))
      rewards = rng.integers(-3, 4, length).astype(float) * 10
      for t in range(length):
        rows.append(
          dict(
            group=f"task{g}",
            rollout=rid,
            step=t,
            obs=f"o{rng.integers(n_obs)}",
            ret=rewards.sum(),
            rew=rewards[t],
            intr=rng.random() * 0.5,
          )
        )
      rid += 1
  perm = rng.permutation(len(rows))
  rows = [rows[i] for i in perm]
  return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def ref_normalise(values, keys, use_std=True, ddof=1, eps=1e-6):
  out = np.zeros(len(values))
  for k in set(keys):
    idx = [i for i in range(len(values)) if keys[i] == k]
    v = np.array([values[i] for i in idx])
    if len(v) == 1:
      continue
    a = v - v.mean()
    if use_std:
      a = a / (v.std(ddof=ddof) + eps)
    out[idx] = a
  return out


def test_grpo_step_level():
  b = random_batch(0)
  got = A.grpo_step_advantages(b["group"], b["ret"], b["intr"])
  want = ref_normalise(b["ret"] + b["intr"], list(b["group"]))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  got0 = A.grpo_step_advantages(b["group"], b["ret"], ddof=0)
  np.testing.assert_allclose(
    got0, ref_normalise(b["ret"], list(b["group"]), ddof=0), rtol=1e-5, atol=1e-6
  )


def test_rollout_level():
  b = random_batch(1)
  got = A.rollout_advantages(b["group"], b["rollout"], b["rew"] + b["intr"])
  # reference: per rollout sum, normalise over rollouts of a group, broadcast
  rollouts = sorted(set(b["rollout"]))
  score = {
    r: sum(b["rew"][i] + b["intr"][i] for i in range(len(b["rew"])) if b["rollout"][i] == r)
    for r in rollouts
  }
  group = {b["rollout"][i]: b["group"][i] for i in range(len(b["rew"]))}
  per_roll = ref_normalise([score[r] for r in rollouts], [group[r] for r in rollouts])
  want = np.array([per_roll[rollouts.index(r)] for r in b["rollout"]])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def ref_discounted(b, gamma):
  out = np.zeros(len(b["rew"]))
  for i in range(len(out)):
    for j in range(len(out)):
      if b["rollout"][j] == b["rollout"][i] and b["step"][j] >= b["step"][i]:
        out[i] += gamma ** (b["step"][j] - b["step"][i]) * b["rew"][j]
  return out


@pytest.mark.parametrize("use_std", [True, False])
def test_gigpo(use_std):
  b = random_batch(2)
  got = A.gigpo_advantages(
    b["group"], b["rollout"], b["step"], b["obs"], b["ret"], b["rew"], gamma=0.95, use_std=use_std
  )
  rollouts = sorted(set(b["rollout"]))
  ret = {b["rollout"][i]: b["ret"][i] for i in range(len(b["ret"]))}
  group = {b["rollout"][i]: b["group"][i] for i in range(len(b["ret"]))}
  ep = ref_normalise([ret[r] for r in rollouts], [group[r] for r in rollouts], use_std=use_std)
  a_ep = np.array([ep[rollouts.index(r)] for r in b["rollout"]])
  g = ref_discounted(b, 0.95)
  anchors = [(b["group"][i], b["obs"][i]) for i in range(len(g))]
  a_step = ref_normalise(g, anchors, use_std=use_std)
  np.testing.assert_allclose(got, a_ep + a_step, rtol=1e-5, atol=1e-5)
  # singleton anchor groups get 0 step advantage
  counts = {k: anchors.count(k) for k in anchors}
  assert any(c == 1 for c in counts.values()) and any(c > 1 for c in counts.values())
  single = np.array([counts[k] == 1 for k in anchors])
  np.testing.assert_allclose(got[single], a_ep[single], rtol=1e-5, atol=1e-6)


def test_discounted_returns():
  b = random_batch(3)
  np.testing.assert_allclose(
    A.discounted_returns(b["rollout"], b["step"], b["rew"], 0.9), ref_discounted(b, 0.9), rtol=1e-10
  )


def test_equal_scores_and_singletons_give_zero():
  groups = ["a"] * 4 + ["b"]
  got = A.grpo_step_advantages(groups, [0.1] * 4 + [5.0])
  assert np.all(np.isfinite(got)) and np.allclose(got, 0.0, atol=1e-6)
  got = A.rollout_advantages(["a", "a", "a"], [0, 1, 1], [33.3, 20.0, 13.3])
  assert np.all(np.isfinite(got)) and np.allclose(got, 0.0, atol=1e-6)
  got = A.gigpo_advantages(["a"] * 3, [0, 1, 2], [0, 0, 0], ["x", "y", "z"], [7.0] * 3, [7.0] * 3)
  assert np.all(np.isfinite(got)) and np.allclose(got, 0.0, atol=1e-6)


def ref_gigpo_verl(b, valid, *, use_std, cross_steps, penalty, gamma=0.95, w=1.0, eps=1e-6):
  """verl-agent's order of operations, written as plain loops over rows in step order: penalty off
  the row's episode score and R_t, episode stats over rows (cross_steps) or one row per trajectory,
  anchor groups by (group, observation)."""
  n = len(b["ret"])
  order = sorted(range(n), key=lambda i: (b["rollout"][i], b["step"][i]))
  g = ref_discounted(b, gamma)
  score = [b["ret"][i] - penalty * (not valid[i]) for i in range(n)]
  step_ret = [g[i] - penalty * (not valid[i]) for i in range(n)]
  by_group, seen = {}, set()
  for i in order:
    if (b["group"][i], b["rollout"][i]) in seen:
      continue
    by_group.setdefault(b["group"][i], []).append(score[i])
    if not cross_steps:
      seen.add((b["group"][i], b["rollout"][i]))
  out = np.zeros(n)
  for i in range(n):
    v = np.array(by_group[b["group"][i]])
    a = 0.0
    if len(v) > 1:
      a = score[i] - v.mean()
      if use_std:
        a /= v.std(ddof=1) + eps
    anchor = [
      step_ret[j] for j in range(n) if (b["group"][j], b["obs"][j]) == (b["group"][i], b["obs"][i])
    ]
    s = 0.0
    if len(anchor) > 1:
      s = step_ret[i] - np.mean(anchor)
      if use_std:
        s /= np.std(anchor, ddof=1) + eps
    out[i] = a + w * s
  return out


@pytest.mark.parametrize("use_std", [True, False])
@pytest.mark.parametrize("stats", ["steps", "trajectory"])
@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_gigpo_verl_agent_switches(use_std, stats, penalty):
  b = random_batch(4, n_groups=3, n=4, max_len=6, n_obs=2)
  valid = np.random.default_rng(5).random(len(b["ret"])) > 0.3
  assert not valid.all() and valid.any()
  got = A.gigpo_advantages(
    b["group"],
    b["rollout"],
    b["step"],
    b["obs"],
    b["ret"],
    b["rew"],
    gamma=0.95,
    use_std=use_std,
    episode_stats=stats,
    valid=valid,
    invalid_penalty=penalty,
  )
  want = ref_gigpo_verl(b, valid, use_std=use_std, cross_steps=stats == "steps", penalty=penalty)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gigpo_switches_change_the_result():
  """Cross-step statistics weigh long episodes more; the penalty lowers invalid turns."""
  b = random_batch(6, n_groups=2, n=4, max_len=6)
  kw = dict(use_std=False, gamma=0.95)
  base = A.gigpo_advantages(b["group"], b["rollout"], b["step"], b["obs"], b["ret"], b["rew"], **kw)
  steps = A.gigpo_advantages(
    b["group"], b["rollout"], b["step"], b["obs"], b["ret"], b["rew"], episode_stats="steps", **kw
  )
  assert not np.allclose(base, steps)
  valid = np.ones(len(b["ret"]), bool)
  valid[0] = False
  pen = A.gigpo_advantages(
    b["group"],
    b["rollout"],
    b["step"],
    b["obs"],
    b["ret"],
    b["rew"],
    valid=valid,
    invalid_penalty=0.1,
    **kw,
  )
  assert pen[0] < base[0]
  # the value is checked once, by the run's AdvantageSettings (not by the kernel)
  with pytest.raises(ValueError, match="advantage.episode_stats='rows'; valid: trajectory, steps"):
    A.AdvantageSettings("gigpo", episode_stats="rows")


def test_turn_advantages_pass_the_turns_valid_flags():
  from empo2_jax.rl.advantages import turn_advantages
  from empo2_jax.rl.batch import Turn

  b = random_batch(7, n_groups=2, n=3, max_len=4)
  valid = np.arange(len(b["ret"])) % 3 != 0
  turns = [
    Turn(
      [],
      "",
      [],
      [],
      "on",
      b["group"][i],
      int(b["rollout"][i]),
      int(b["step"][i]),
      float(b["ret"][i]),
      float(b["rew"][i]),
      0.0,
      b["obs"][i],
      bool(valid[i]),
    )
    for i in range(len(valid))
  ]
  kw = dict(gamma=0.9, step_weight=1.0, use_std=False, episode_stats="steps", invalid_penalty=0.1)
  got = turn_advantages(turns, "gigpo", **kw)
  want = A.gigpo_advantages(
    b["group"], b["rollout"], b["step"], b["obs"], b["ret"], b["rew"], valid=valid, **kw
  )
  np.testing.assert_allclose(got, want)
  assert not np.allclose(got, turn_advantages(turns, "gigpo", **{**kw, "invalid_penalty": 0.0}))


def _turns(b, valid=None):
  """rl/batch.Turn objects of a flat batch (intrinsic from b["intr"])."""
  from empo2_jax.rl.batch import Turn

  valid = np.ones(len(b["ret"]), bool) if valid is None else valid
  return [
    Turn(
      messages=[],
      response="",
      response_ids=[],
      sampler_logprobs=[],
      mode="on_tips",
      group_id=b["group"][i],
      rollout_id=int(b["rollout"][i]),
      step=int(b["step"][i]),
      episode_return=float(b["ret"][i]),
      reward=float(b["rew"][i]),
      intrinsic=float(b["intr"][i]),
      obs_key=b["obs"][i],
      valid=bool(valid[i]),
    )
    for i in range(len(b["ret"]))
  ]


def ref_gigpo_episodes(episodes, *, gamma, use_std, cross_steps, penalty, eps=1e-6):
  """GiGPO with EMPO2's memory reward, by hand, episode by episode: the step reward is
  env reward + r_int (docs/method.md §3, §6), so the episode score is the env return plus the
  summed r_int and R_t = sum_k gamma^k (r_{t+k} + r_int_{t+k}); penalty off both on invalid rows.
  episodes: {rollout: (group, env return, [(obs, reward, intrinsic, valid) in step order])}.
  Returns {(rollout, step): advantage}."""
  score, step_ret = {}, {}
  for rid, (_, ret, steps) in episodes.items():
    total = ret + sum(s[2] for s in steps)
    for t, (_, _, _, ok) in enumerate(steps):
      g = sum(gamma**k * (s[1] + s[2]) for k, s in enumerate(steps[t:]))
      score[rid, t] = total - penalty * (not ok)
      step_ret[rid, t] = g - penalty * (not ok)

  def norm(x, pool):
    if len(pool) < 2:
      return 0.0
    a = x - np.mean(pool)
    return a / (np.std(pool, ddof=1) + eps) if use_std else a

  out = {}
  for rid, (group, _, steps) in episodes.items():
    mates = [r for r, e in episodes.items() if e[0] == group]
    pool = [score[r, t] for r in mates for t in range(len(episodes[r][2]) if cross_steps else 1)]
    for t, (obs, _, _, _) in enumerate(steps):
      anchor = [step_ret[r, k] for r in mates for k, s in enumerate(episodes[r][2]) if s[0] == obs]
      out[rid, t] = norm(score[rid, t], pool) + norm(step_ret[rid, t], anchor)
  return out


def test_gigpo_intrinsic_by_hand():
  """Two episodes of one task, use_std False, gamma 0.5. A: rewards [0, 10], r_int [1, 0.5];
  B: reward [0], r_int [1]; both start at "s". Episode scores 11.5 and 1 (mean 6.25): +-5.25.
  Step returns A: 0 + 1 + 0.5 * 10.5 = 6.25, 10.5; B: 1; the anchor "s" {6.25, 1} (mean 3.625):
  +-2.625, A's second step alone: 0. Without r_int it would be 7.5, 5, -7.5."""
  from empo2_jax.rl.advantages import turn_advantages

  b = {
    "group": np.array(["t", "t", "t"]),
    "rollout": np.array([1, 0, 0]),
    "step": np.array([0, 1, 0]),
    "obs": np.array(["s", "x", "s"]),
    "ret": np.array([0.0, 10.0, 10.0]),
    "rew": np.array([0.0, 10.0, 0.0]),
    "intr": np.array([1.0, 0.5, 1.0]),
  }
  got = turn_advantages(_turns(b), "gigpo", gamma=0.5, use_std=False)
  np.testing.assert_array_equal(got, np.float32([-7.875, 5.25, 7.875]))


@pytest.mark.parametrize("use_std", [True, False])
@pytest.mark.parametrize("stats", ["steps", "trajectory"])
@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_gigpo_turn_advantages_add_the_intrinsic_reward(use_std, stats, penalty):
  """turn_advantages("gigpo") vs the by-hand reference on shuffled turns, every switch."""
  from empo2_jax.rl.advantages import turn_advantages

  b = random_batch(8, n_groups=2, n=4, max_len=5, n_obs=2)
  valid = np.random.default_rng(9).random(len(b["ret"])) > 0.3
  episodes = {}
  for i in sorted(range(len(b["ret"])), key=lambda i: (b["rollout"][i], b["step"][i])):
    e = episodes.setdefault(b["rollout"][i], (b["group"][i], b["ret"][i], []))
    e[2].append((b["obs"][i], b["rew"][i], b["intr"][i], valid[i]))
  kw = dict(gamma=0.95, step_weight=1.0, use_std=use_std, episode_stats=stats)
  got = turn_advantages(_turns(b, valid), "gigpo", invalid_penalty=penalty, **kw)
  ref = ref_gigpo_episodes(
    episodes, gamma=0.95, use_std=use_std, cross_steps=stats == "steps", penalty=penalty
  )
  want = [ref[b["rollout"][i], b["step"][i]] for i in range(len(b["ret"]))]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # the reward matters: the same turns with r_int = 0 give other advantages
  no_intr = turn_advantages(_turns({**b, "intr": 0 * b["intr"]}, valid), "gigpo", **kw)
  assert not np.allclose(got, no_intr, atol=1e-3)


@pytest.mark.parametrize("stats", ["steps", "trajectory"])
@pytest.mark.parametrize("use_std", [True, False])
def test_gigpo_without_intrinsic_is_unchanged(stats, use_std):
  """All r_int = 0: bit-equal to gigpo_advantages on the env returns and rewards alone (the
  estimator before the memory reward entered it)."""
  from empo2_jax.rl.advantages import turn_advantages

  b = random_batch(10, n_groups=3, n=4, max_len=6)
  b["intr"] = np.zeros(len(b["ret"]))
  valid = np.arange(len(b["ret"])) % 4 != 1
  kw = dict(gamma=0.95, step_weight=0.7, use_std=use_std, episode_stats=stats, invalid_penalty=0.1)
  got = turn_advantages(_turns(b, valid), "gigpo", **kw)
  want = A.gigpo_advantages(
    b["group"], b["rollout"], b["step"], b["obs"], b["ret"], b["rew"], valid=valid, **kw
  )
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("estimator", ["grpo_step", "grpo_rollout", "gigpo"])
def test_every_estimator_reads_the_intrinsic_reward(estimator):
  """One turn's r_int moves the advantages under every estimator (build.check_config's list)."""
  from empo2_jax.rl.advantages import turn_advantages

  b = random_batch(11, n_groups=1, n=4, max_len=3)
  kw = dict(gamma=0.95, use_std=False) if estimator == "gigpo" else {}
  base = turn_advantages(_turns({**b, "intr": 0 * b["intr"]}), estimator, **kw)
  one = np.zeros(len(b["ret"]))
  one[0] = 5.0
  assert not np.allclose(turn_advantages(_turns({**b, "intr": one}), estimator, **kw), base)


def test_estimator_registry_takes_its_settings_by_name_and_refuses_unknown_names():
  """advantage.estimator is a registry (rl/advantages.ESTIMATORS): a new estimator is one
  decorated function; its settings come from the config section by name, explicit values win."""
  import types

  from empo2_jax.rl import advantages as adv

  seen = {}

  @adv.register_estimator("toy_adv", settings=("gamma",))
  def toy(turns, gamma=0.0):
    seen["gamma"] = gamma
    return np.full(len(turns), gamma, np.float32)

  try:
    turns = [types.SimpleNamespace()] * 3
    got = adv.turn_advantages(turns, "toy_adv", {"gamma": 0.5, "use_std": True})
    assert seen["gamma"] == 0.5 and got.tolist() == [0.5] * 3
    assert adv.turn_advantages(turns, "toy_adv", {"gamma": 0.5}, gamma=0.25)[0] == 0.25
    with pytest.raises(ValueError, match="already registered"):
      adv.register_estimator("toy_adv")(toy)
    with pytest.raises(
      ValueError, match="valid: grpo_step, grpo_rollout, return_positive, gigpo, toy_adv"
    ):
      adv.turn_advantages(turns, "ppo")
  finally:
    del adv.ESTIMATORS["toy_adv"]


def test_an_estimator_declares_its_own_config_keys():
  """register_estimator(keys=...) adds the estimator's keys to the `advantage` section with their
  defaults (defaults.get_config), and the estimator reads them from the config by name."""
  import types

  from empo2_jax import defaults
  from empo2_jax.rl import advantages as adv

  @adv.register_estimator("toy_keys", settings=("gamma",), keys={"toy_shift": 0.5})
  def toy(turns, gamma=0.0, toy_shift=0.0):
    return np.full(len(turns), gamma + toy_shift, np.float32)

  try:
    c = defaults.get_config()
    assert c.advantage.toy_shift == 0.5 and c.advantage.gamma == 0.95
    c.advantage.toy_shift = 2.0
    got = adv.turn_advantages([types.SimpleNamespace()] * 2, "toy_keys", c.advantage)
    np.testing.assert_allclose(got, [2.95, 2.95], rtol=1e-6)
    with pytest.raises(ValueError, match="'toy_keys''s key with default 0.5"):
      adv.register_estimator("other", keys={"toy_shift": 1.0})
    assert "other" not in adv.ESTIMATORS
  finally:
    del adv.ESTIMATORS["toy_keys"]
  assert "toy_shift" not in defaults.get_config().advantage


def test_return_positive_gives_one_to_every_turn_of_a_positive_return():
  from empo2_jax.rl.batch import Turn

  def turn(ret, step):
    return Turn([], "", [1], [0.0], "off", 0, 0, step, ret)

  turns = [turn(1.0, 0), turn(1.0, 1), turn(0.0, 0), turn(-1.0, 0), turn(0.5, 0)]
  got = A.turn_advantages(turns, "return_positive")
  np.testing.assert_array_equal(got, [1.0, 1.0, 0.0, 0.0, 1.0])
