"""launch/compare.py and train/compare.py: per-arm mean ± s.e. over seeds, paired differences
against a baseline with 95% intervals, tip usage; scipy's paired t-test is the reference."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from empo2_jax.baselines.results import write_result
from empo2_jax.train import compare


def _records(rng, arms=("grpo", "empo2"), seeds=(0, 1, 2), variations=tuple(range(75, 90))):
  out = []
  for arm in arms:
    for s in seeds:
      returns = rng.integers(0, 101, len(variations)).astype(float)
      out.append(
        {
          "method": arm,
          "seed": s,
          "variations": list(variations),
          "returns": list(returns),
          "successes": list(returns == 100),
        }
      )
  return out


def test_paired_differences_match_scipy_paired_t_test():
  rng = np.random.default_rng(0)
  recs = _records(rng)
  rng.shuffle(recs)  # order does not matter
  # the arm evaluated one variation more on seed 1: only pairs present in both count
  extra = next(r for r in recs if r["method"] == "empo2" and r["seed"] == 1)
  extra["variations"] = extra["variations"] + [999]
  extra["returns"] = extra["returns"] + [50.0]
  extra["successes"] = extra["successes"] + [False]
  (row,) = compare.paired_differences(recs, "grpo")

  def by(arm):
    rs = sorted((r for r in recs if r["method"] == arm), key=lambda r: r["seed"])
    return [dict(zip(r["variations"], r["returns"])) for r in rs]

  grpo, empo2 = by("grpo"), by("empo2")
  a = np.array([e[v] for g, e in zip(grpo, empo2) for v in g])
  b = np.array([g[v] for g, e in zip(grpo, empo2) for v in g])
  test = stats.ttest_rel(a, b)
  ci = test.confidence_interval(0.95)
  assert row["pairs"] == 45 and row["seeds"] == 3
  np.testing.assert_allclose(
    [row["mean"], row["pairs_low"], row["pairs_high"]],
    [np.mean(a - b), ci.low, ci.high],
    rtol=1e-12,
  )
  seed_means = [np.mean([e[v] - g[v] for v in g]) for g, e in zip(grpo, empo2)]
  ci_s = stats.ttest_1samp(seed_means, 0.0).confidence_interval(0.95)
  np.testing.assert_allclose([row["seeds_low"], row["seeds_high"]], [ci_s.low, ci_s.high])
  assert row["wins"] + row["ties"] + row["losses"] == 45
  assert row["wins"] == int((a > b).sum()) and row["losses"] == int((a < b).sum())


def test_arm_summary_is_mean_and_standard_error_over_seed_means():
  rng = np.random.default_rng(1)
  recs = _records(rng, arms=("grpo", "empo2", "empo2_rule"))
  rows = {r["arm"]: r for r in compare.arm_summary(recs)}
  assert list(rows) == ["grpo", "empo2", "empo2_rule"]
  for arm, row in rows.items():
    means = [
      np.mean(r["returns"]) for r in sorted(recs, key=lambda r: r["seed"]) if r["method"] == arm
    ]
    assert row["seeds"] == 3 and row["episodes"] == 45
    np.testing.assert_allclose(row["return_mean"], np.mean(means))
    np.testing.assert_allclose(row["return_se"], stats.sem(means))
    np.testing.assert_allclose(row["seed_means"], means)


def test_one_seed_has_no_seed_interval_and_bad_records_are_refused():
  rng = np.random.default_rng(2)
  recs = _records(rng, seeds=(0,))
  (row,) = compare.paired_differences(recs, "grpo")
  assert math.isnan(compare.arm_summary(recs)[0]["return_se"])
  assert math.isnan(row["seeds_low"]) and not math.isnan(row["pairs_low"])
  assert "n/a" in compare.report_markdown(compare.arm_summary(recs), [row])
  with pytest.raises(ValueError, match="no evaluation of the baseline 'naive'"):
    compare.paired_differences(recs, "naive")
  with pytest.raises(ValueError, match="two evaluations of grpo seed 0"):
    compare.arm_summary(recs + [dict(recs[0])])
  with pytest.raises(ValueError, match="has no 'seed'"):
    compare.arm_summary([{k: v for k, v in recs[0].items() if k != "seed"}])
  other = _records(rng, arms=("empo2",), seeds=(5,))
  with pytest.raises(ValueError, match="empo2 shares no"):
    compare.paired_differences([recs[0]] + other, "grpo")


def _episode(it, use_memory, num_tips, tip="", shown=()):
  return {
    "iteration": it,
    "use_memory": use_memory,
    "tip": tip,
    "tips": list(shown),
    "turns": {"num_tips": list(num_tips)},
  }


def test_tip_usage_counts_memory_steps_that_showed_tips():
  eps = [
    _episode(1, False, [0, 0, 0], tip="go to the kitchen"),
    _episode(2, True, [0, 1, 2], tip="focus on the axe", shown=["go to the kitchen"] * 3),
    _episode(3, True, [1, 0], tip=" ", shown=["focus on the axe"]),
  ]
  u = compare.tip_usage(eps)
  assert (u["episodes"], u["memory_episodes"], u["memory_steps"], u["steps_with_tips"]) == (
    3,
    2,
    5,
    3,
  )
  assert u["share_with_tips"] == pytest.approx(0.6)
  assert u["tips_written"] == 2  # the blank one is not a tip
  assert u["written"] == ["focus on the axe", "go to the kitchen"]  # latest first, distinct
  assert u["shown"] == ["focus on the axe", "go to the kitchen"]
  assert math.isnan(compare.tip_usage([eps[0]])["share_with_tips"])


def test_launch_compare_writes_the_tables(tmp_path, capsys):
  from launch import compare as cli_compare

  rng = np.random.default_rng(3)
  for r in _records(rng):
    write_result(
      tmp_path / "it4" / f"{r['method']}_s{r['seed']}",
      method=r["method"],
      task="find-non-living-thing",
      env="scienceworld",
      returns=r["returns"],
      successes=r["successes"],
      extra={"seed": r["seed"], "variations": r["variations"], "iteration": 4},
    )
  cli_compare.main([f"--runs={tmp_path / 'it4'}", f"--out={tmp_path / 'out'}"])
  out = capsys.readouterr().out
  assert (
    "| empo2 - grpo |" not in out and "| arm - grpo |" in out and "| empo2 | 45 (3 seeds)" in out
  )
  blob = json.loads((tmp_path / "out" / "compare.json").read_text())
  assert [r["arm"] for r in blob["summary"]] == ["grpo", "empo2"]
  assert blob["paired"][0]["pairs"] == 45
  cli_compare.main([f"--runs={tmp_path / 'it4'}", "--arms=empo2", "--baseline="])
  assert "| empo2 | 3 |" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    cli_compare.main([f"--runs={tmp_path / 'it4'}", "--baseline=nope"])
  assert "no evaluation of the baseline 'nope'" in capsys.readouterr().err
