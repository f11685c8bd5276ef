"""Per-view instrumentation (train/view_metrics.py): counts against a hand-built batch, and a tiny
run's metrics.jsonl and saved episodes against its own batch and update."""

import json
import os
import types

import numpy as np
import pytest

from empo2_jax.train import view_metrics as vm


def _turn(mode, adv, n_resp=3):
  return types.SimpleNamespace(mode=mode, advantage=adv, response_ids=[1] * n_resp)


def test_view_metrics_count_what_the_batch_holds():
  # 6 turns: 0-3 "off" (3 in the batch, 1 dropped as too long a prompt), 4 "off" with a too
  # long response, 5 "on_tips" in the batch.
  turns = [
    _turn("off", 1.0),
    _turn("off", -1.0),
    _turn("off", 0.5),
    _turn("off", 2.0),
    _turn("off", 1.0, n_resp=99),
    _turn("on_tips", 1.0),
  ]
  # packed layout [B=2, T=3]; row 1's last slot is padding
  sample_index = np.array([[0, 1, 5], [2, -1, -1]], np.int32)
  per = {
    "masked": np.array([[True, False, False], [True, False, False]]),
    "min_old_logp": np.array([[-7.0, -1.0, -2.0], [-6.0, 0.0, 0.0]], np.float32),
    "old_logp_sum": np.array([[-9.0, -2.0, -3.0], [-8.0, 0.0, 0.0]], np.float32),
    "tokens": np.array([[3, 2, 2], [3, 0, 0]], np.int32),
  }
  eps = [
    types.SimpleNamespace(
      mode="off", env_failed=False, use_memory=True, retrieved=[10, 0, 3], prompt_tokens=[5, 9, 7]
    ),
    types.SimpleNamespace(
      mode="off", env_failed=False, use_memory=True, retrieved=[10], prompt_tokens=[11]
    ),
  ]
  m = vm.view_metrics(
    turns, sample_index, per, eps, {"truncations": 4}, response_len=8, low_prob_delta=-5.0
  )
  off = {k[len("view/off/") :]: v for k, v in m.items() if k.startswith("view/off/")}
  assert off["turns"] == 5 and off["samples"] == 3
  assert off["dropped_long"] == 1 and off["dropped_response"] == 1
  assert off["pos_adv"] == 2 and off["masked"] == 2 and off["masked_pos_adv"] == 2
  assert off["below_delta"] == 2  # -7 and -6 < -5
  assert off["kept_tokens"] == 2  # turn 1 only
  np.testing.assert_allclose(off["old_logp_mean"], (-9 - 2 - 8) / (3 + 2 + 3))
  assert off["old_logp_min"] == -7.0
  np.testing.assert_allclose(off["min_old_logp_mean"], (-7 - 1 - 6) / 3)
  assert off["context_truncations"] == 4  # every episode "off": the rollout's counter
  assert off["memory_steps"] == 4 and off["tips_max"] == 10 and off["tips_min"] == 0
  assert off["tips_zero"] == 1 and off["tips_mean"] == pytest.approx(23 / 4)
  assert off["prompt_tokens_mean"] == 8.0 and off["prompt_tokens_max"] == 11
  assert m["view/on_tips/samples"] == 1 and m["view/on_tips/masked"] == 0
  assert not any(k.startswith("view/on/") for k in m)

  vm.attach(turns, sample_index, per)
  assert [t.lowprob_masked for t in turns] == [True, False, True, None, None, False]
  assert turns[2].min_old_logp == -6.0 and turns[3].min_old_logp is None


def test_attach_refuses_mismatched_arrays():
  with pytest.raises(ValueError, match="sample_index"):
    vm.attach([_turn("on", 0.0)], np.array([0, -1]), {"masked": [0], "min_old_logp": [0.0]})


@pytest.mark.slow
def test_tiny_run_logs_view_metrics_checked_against_its_batch(tmp_path):
  """FrozenLake tiny: an on_tips iteration writes tips, then an off-policy one with the mask on;
  its metrics.jsonl row and its saved episodes agree with the batch and the update's metrics."""
  from configs import frozenlake
  from empo2_jax.train.trainer import Trainer

  config = frozenlake.get_config("tiny")
  config.train.iterations = 1
  config.train.save_episodes = True
  config.empo2.force_mode = "off"
  config.loss.low_prob_mask = True
  # The tiny random model's samples have min old log-probs of -12.27 .. -12.08 (seed 0): this
  # threshold splits them in half.
  config.loss.low_prob_delta = -12.18
  trainer = Trainer(config, str(tmp_path), progress=False)
  results, iterate = [], trainer.train_iteration
  trainer.train_iteration = lambda: results.append(iterate()) or results[-1]
  (m,) = trainer.run()  # run() closes the trainer
  (result,) = results
  batch, turns = result.batch, [t for e in result.episodes for t in e.turns]
  idx = batch["sample_index"]
  in_batch = set(int(i) for i in idx[idx >= 0])
  assert m["view/off/samples"] == len(in_batch) == m["samples"]
  assert m["view/off/turns"] == len(turns)
  assert m["view/off/dropped_long"] == m["dropped_long"]
  assert m["view/off/kept_tokens"] == m["loss/n_tokens"]
  assert m["view/off/masked"] == m["view/off/below_delta"]  # the mask is on
  assert 0 < m["view/off/masked"] < len(in_batch)
  np.testing.assert_allclose(m["view/off/masked"] / len(in_batch), m["loss/masked_frac"])
  trained = [t for t in turns if t.lowprob_masked is not None]
  assert len(trained) == len(in_batch)
  assert sum(t.lowprob_masked for t in trained) == m["view/off/masked"]
  assert all((t.min_old_logp < -12.18) == t.lowprob_masked for t in trained)
  pos = sum(t.lowprob_masked and t.advantage > 0 for t in trained)
  assert m["view/off/masked_pos_adv"] == pos
  assert m["view/off/memory_steps"] == len(turns) and m["view/off/tips_mean"] >= 0
  assert m["view/off/context_truncations"] >= 0
  lengths = [n for e in result.episodes for n in e.prompt_tokens]
  assert len(lengths) == len(turns) and m["view/off/prompt_tokens_max"] == max(lengths)

  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    row = json.loads(f.readlines()[-1])
  views = {k: v for k, v in m.items() if k.startswith("view/")}
  assert {k: v for k, v in row.items() if k.startswith("view/")} == views
  staging = os.path.join(tmp_path, "episodes", "staging")
  with open(os.path.join(staging, sorted(os.listdir(staging))[-1])) as f:
    recs = [json.loads(line) for line in f]
  flags = [x for r in recs for x in r["turns"]["lowprob_masked"]]
  assert sum(x == 1 for x in flags) == m["view/off/masked"]
  assert sum(x >= 0 for x in flags) == m["view/off/samples"]
