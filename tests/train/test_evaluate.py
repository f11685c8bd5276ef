import csv
import io

import numpy as np
import pytest

from empo2_jax.train import evaluate


def test_summary_and_tables():
  rows = [
    evaluate.summarize("find-animal", "no memory", [100, 50, -100, 8], [1, 0, 0, 0]),
    evaluate.summarize("power-component", "no memory", [90, 100], [1, 1]),
  ]
  assert rows[0]["return_mean"] == pytest.approx(14.5)
  assert rows[0]["return_std"] == pytest.approx(np.std([100, 50, -100, 8]))
  assert rows[0]["success"] == 0.25
  full = evaluate.with_average(rows)
  assert full[-1]["task"] == "average" and full[-1]["return_mean"] == pytest.approx((14.5 + 95) / 2)
  md = evaluate.table_markdown(full)
  assert "| find-animal | no memory | 4 | 14.5 ± " in md and "| 25.0% |" in md
  back = list(csv.DictReader(io.StringIO(evaluate.table_csv(full))))
  assert [r["task"] for r in back] == ["find-animal", "power-component", "average"]
  with pytest.raises(ValueError, match="no episodes"):
    evaluate.summarize("x", "y", [], [])


def _evaluator(repeats, eval_batch, variations_per_iter=2, group_size=2):
  """An Evaluator whose actor records each rollout call."""
  import types

  import jax
  from configs import sciworld

  from empo2_jax.agent.actor import Rollout
  from empo2_jax.train.evaluate import Evaluator

  c = sciworld.get_config("tiny")
  c.train.eval_repeats, c.train.eval_batch = repeats, eval_batch
  c.rollout.variations_per_iter, c.rollout.group_size = variations_per_iter, group_size
  calls = []

  def rollout(params, model_config, specs, *, rng, notes, **kw):
    assert params == "params" and model_config == "model"  # one copy of the weights, every part
    calls.append((list(specs), np.asarray(jax.random.key_data(rng)), kw))
    return Rollout([types.SimpleNamespace(spec=s) for s in specs], {})

  actor = types.SimpleNamespace(rollout=rollout)
  return Evaluator(c, actor, "model", notes=lambda specs: None), calls


def test_evaluation_samples_at_most_eval_batch_episodes_at_once():
  import jax

  ev, calls = _evaluator(repeats=3, eval_batch=4)
  base = jax.random.fold_in(jax.random.PRNGKey(7), 10_000_000 + 3)
  episodes = ev.episodes("params", base, [5, 9, 11], with_memory=False)
  want = [(ev.config.env.task, v, g) for g, v in enumerate([5, 9, 11]) for _ in range(3)]
  assert [e.spec for e in episodes] == want  # every episode once, in spec order
  assert [len(specs) for specs, _, _ in calls] == [4, 4, 1]
  keys = [jax.random.key_data(base)] + [
    jax.random.key_data(jax.random.fold_in(base, k)) for k in (1, 2)
  ]
  for (_, got, kw), key in zip(calls, keys):
    np.testing.assert_array_equal(got, np.asarray(key))
    assert kw["mode"] == "eval" and kw["use_memory"] is False
  assert len({bytes(got) for _, got, _ in calls}) == 3  # each part draws its own keys

  # 0: a training rollout's variations x group (2 x 2); an evaluation that fits is one call with the
  # iteration's key, as before the split.
  ev, calls = _evaluator(repeats=2, eval_batch=0)
  assert len(ev.episodes("params", base, [1, 2], with_memory=True)) == 4
  assert [len(s) for s, _, _ in calls] == [4]
  np.testing.assert_array_equal(calls[0][1], np.asarray(keys[0]))
  assert calls[0][2]["use_memory"] is True
