"""The vault bench (train/vault_data.py, vault_bench.py, vault_report.py, launch/vault_bench.py):
its SFT data and memories, its exact scores against a direct forward of the model, its statistics
against hand-computed values, the decision rules, and (slow) the one command end to end on a tiny
model: the start, the gate, two arms, a rerun that skips them, the report."""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from empo2_jax.envs import vault
from empo2_jax.envs.vault import VaultConfig, VaultEnv, code_text, vault_code, vault_name
from empo2_jax.train import vault_data, vault_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = VaultEnv(VaultConfig())


def test_shifted_tips_never_give_a_vault_its_own_code():
  vaults = list(range(8))
  tips = vault_data.shifted_tips(vaults, ENV.config)
  own = {v: vault_data.oracle_tip(v, ENV.config) for v in vaults}
  assert set(tips.values()) <= set(own.values())
  for v in vaults:
    assert code_text(vault_code(v)) not in tips[v]
  with pytest.raises(ValueError, match="no shift"):
    vault_data.shifted_tips([0, 0], ENV.config)  # the same vault twice: always its own code


def test_sft_vaults_skip_the_benchs_names_and_chats_teach_the_format():
  taken = [vault_name(v) for v in range(8)]
  seeds = vault_data.sft_vault_seeds(3000, taken)
  assert len(seeds) == 3000 and min(seeds) >= vault_data.SFT_FIRST_SEED
  assert not {vault_name(s) for s in seeds} & set(taken)
  chats = vault_data.sft_chats(ENV, seeds, np.random.default_rng(0), 0.75, tip_kinds="mixed")
  assert len(chats) == 2 * len(seeds)
  copied = shown_oracle = 0
  for k, s in enumerate(seeds):
    free, tipped = chats[2 * k], chats[2 * k + 1]
    code = code_text(vault_code(s))
    assert "<tip>" not in free[0]["content"] and "<tip>" in tipped[0]["content"]
    for chat in (free, tipped):
      answer = chat[1]["content"].split(" || ")
      assert len(answer) == 3 and set(answer) <= set(vault.BUTTONS)
    if vault_data.tip_for(vault_code(s), True) in tipped[0]["content"]:
      shown_oracle += 1
      copied += tipped[1]["content"] == code
  share = shown_oracle / len(seeds)
  assert abs(share - 0.85) < 0.03  # the oracle tip is in the "oracle" and "mixed" blocks
  rate = copied / shown_oracle  # p_copy plus the chance that a random code is the code
  assert abs(rate - (0.75 + 0.25 / 64)) < 0.03
  oracle = vault_data.sft_chats(ENV, seeds[:200], np.random.default_rng(1), 0.75)  # the default
  for k, s in enumerate(seeds[:200]):
    tip_block = oracle[2 * k + 1][0]["content"]
    assert tip_block.count("score") == 2 and vault_data.tip_for(vault_code(s), True) in tip_block
  with pytest.raises(ValueError, match="tip_kinds='all'; valid: oracle, mixed"):
    vault_data.sft_chats(ENV, seeds[:1], np.random.default_rng(0), 0.75, tip_kinds="all")


def test_scores_equal_a_direct_forward_of_the_model():
  """score_vaults' summed log-prob and greedy flag against the model run on the tokenised chat
  followed by the code, the log-softmax taken in numpy."""
  from empo2_jax.model import llama
  from empo2_jax.model.tokenizer import load_tokenizer
  from tests.helpers.tiny_model import TINY

  tok = load_tokenizer()
  model = dataclasses.replace(TINY, vocab_size=len(tok))
  params = llama.init_params(model, jax.random.PRNGKey(3))
  vaults = [0, 1, 2]
  tips = {v: vault_data.oracle_tip(v, ENV.config) for v in vaults}
  for shown in (None, tips):
    got = vault_data.score_vaults(params, model, tok, ENV, vaults, shown)
    for v in vaults:
      msgs = vault_data.first_message(ENV, v, [tips[v]] if shown else [])
      prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
      p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
      c_ids = tok(code_text(vault_code(v)), add_special_tokens=False)["input_ids"]
      seq = jnp.asarray([p_ids + c_ids])
      logits = np.asarray(llama.forward(params, model, seq, jnp.ones_like(seq)), np.float64)[0]
      z = logits[len(p_ids) - 1 : -1]
      logp = z - z.max(-1, keepdims=True)
      logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
      want = logp[np.arange(len(c_ids)), c_ids].sum()
      np.testing.assert_allclose(got[v]["logp"], want, rtol=1e-4, atol=1e-4)
      assert got[v]["greedy"] == bool(np.all(z.argmax(-1) == np.asarray(c_ids)))


def _record(arm, seed, greedy, unseen=0.0, kl=None, added=None, adv=0.5):
  """A synthetic arm-seed record: `greedy` of the 8 trained vaults answered greedily."""
  n = round(greedy * 8)
  trained = {str(v): {"greedy": v < n, "logp": math.log(0.9 if v < n else 0.01)} for v in range(8)}
  unseen_s = {
    str(v): {"greedy": v < round(unseen * 16), "logp": math.log(1 / 64)} for v in range(16)
  }
  mets = [{"success": greedy, "groups_mixed": 0.5, "advantage_abs_mean": adv} for _ in kl or (0, 0)]
  for m, k in zip(mets, kl or ()):
    m["loss/ctx_kl_k1"] = k
  if added is not None:
    mets = [{**m, "loss/opid/abs_added": added, "loss/opid/abs_adv": 0.8} for m in mets]
  scores = {"trained": trained, "unseen": unseen_s, "trained_with_tips": trained}
  return {"arm": arm, "seed": seed, "iterations": len(mets), "metrics": mets, "scores": scores}


def test_paired_differences_and_intervals_match_hand_computed_values():
  recs = [_record("D", s, g) for s, g in enumerate([0.0, 0.125, 0.0, 0.0, 0.125])]
  recs += [_record("A", s, g) for s, g in enumerate([0.5, 0.625, 0.75, 0.5, 0.625])]
  rows = vault_report.summarize(recs)
  mean, low, high, diffs = rows["A"]["minus_d"]["greedy"]
  want = np.array([0.5, 0.5, 0.75, 0.5, 0.5])
  np.testing.assert_allclose(diffs, want)
  half = 2.7764451051977987 * want.std(ddof=1) / math.sqrt(5)  # t(0.975, 4 dof)
  np.testing.assert_allclose([mean, low, high], [0.55, 0.55 - half, 0.55 + half], rtol=1e-9)
  np.testing.assert_allclose(rows["A"]["figures"]["greedy"], 0.6)
  one_right = (0.9 + 7 * 0.01) / 8  # a seed whose greedy answer is right on one vault of 8
  np.testing.assert_allclose(rows["D"]["figures"]["p_code"], (3 * 0.01 + 2 * one_right) / 5)


def test_decision_rules():
  d = [_record("D", s, 0.0) for s in range(5)]
  p = [_record("P", s, 0.875) for s in range(5)]
  w = [_record("W", s, 0.0, kl=(0.5, 0.4)) for s in range(5)]
  dist = [_record("A", s, g) for s, g in enumerate([0.5, 0.625, 0.75, 0.5, 0.625])]
  flat = [_record("F", s, g, kl=(0.8, 0.3)) for s, g in enumerate([0.0, 0.0, 0.125, 0.0, 0.0])]
  idle = [_record("G", s, 0.0, added=0.0) for s in range(5)]
  unseen = [_record("B", s, 0.75, unseen=0.5) for s in range(5)]  # moves unseen vaults too
  rows = vault_report.summarize(d + p + w + dist + flat + idle + unseen)
  assert vault_report.decide("A", rows, gate_holds=True) == "distils"
  assert vault_report.decide("F", rows, gate_holds=True) == "does not distil"
  assert vault_report.decide("G", rows, gate_holds=True) == "undecided"  # machinery idle
  assert vault_report.decide("B", rows, gate_holds=True) == "undecided"  # unseen off chance
  assert vault_report.decide("F", rows, gate_holds=False) == "undecided"  # the gate failed
  rows_no_w = vault_report.summarize(d + p + dist)
  assert vault_report.decide("A", rows_no_w, gate_holds=True) == "undecided"  # no negative control
  rows_no_p = vault_report.summarize(d + w + flat)
  assert vault_report.decide("F", rows_no_p, gate_holds=True) == "undecided"  # no positive control
  table = vault_report.table(rows, True)
  assert "| A | 5 | 0.600 | +0.600 [" in table and "distils" in table


@pytest.mark.slow
def test_the_bench_command_end_to_end(tmp_path):
  """The one command on a tiny random model, 1 seed, arms D and F, 2 iterations each (the gate
  cannot hold for an untrained model: --ignore_gate): the start, the gate and both records are
  written, F's memory stays the oracle one (frozen) and its teacher views are built; a rerun skips
  everything; --report prints the table and writes the plot."""
  root, records = tmp_path / "root", tmp_path / "records"
  cmd = [
    sys.executable, "launch/vault_bench.py", "--config=configs/vault.py:tiny",
    "--config.sft.steps=2", "--config.sft.batch_rows=4", "--config.sft.micro_rows=4",
    "--sft_vaults=16", f"--root={root}", f"--records={records}", "--arms=D,F", "--seeds=0",
    "--iterations=2", "--ignore_gate",
  ]  # fmt: skip
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  gate = json.loads((records / "gate.json").read_text())
  assert gate["episodes_each"] == 8 * 4 * 4 and set(gate["exact"]) == {
    "trained", "unseen", "trained_with_tips",
  }  # fmt: skip
  for arm in ("D", "F"):
    rec = json.loads((records / "arms" / f"{arm}_s0.json").read_text())
    assert rec["iterations"] == 2 and len(rec["metrics"]) == 2
    assert len(rec["scores"]["trained"]) == 8 and len(rec["scores"]["unseen"]) == 16
    assert all(m["memory_size"] == 8 for m in rec["metrics"])  # frozen: the 8 oracle tips
  f = json.loads((records / "arms" / "F_s0.json").read_text())
  assert all(m["ctx_distill/teacher_turns"] == 32 for m in f["metrics"])
  assert all(m["mode"] == "off" for m in f["metrics"])
  assert not (root / "runs" / "F_s0").exists()  # the workdir goes once the record is written
  again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0 and "vault arm=F seed=0" in again.stdout
  # the start's weights gone (a fresh machine): built and gated again, the first gate kept
  first_gate = (records / "gate.json").read_text()
  shutil.rmtree(root / "start")
  rebuilt = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
  assert (records / "gate.json").read_text() == first_gate
  assert (records / "start_rebuilt.json").exists() and (records / "gate_rebuilt.json").exists()
  assert "vault arm=F seed=0" in rebuilt.stdout  # the records stand: no arm-seed reruns
  rep = subprocess.run(
    [sys.executable, "launch/vault_bench.py", f"--records={records}", "--report"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert rep.returncode == 0, rep.stderr[-2000:]
  assert "| D | 1 |" in rep.stdout and (records / "vault_bench.png").exists()


def test_the_post_hoc_measure_leaves_out_vaults_that_share_a_code():
  vaults = [str(v) for v in range(8)]
  shared = vault_report._shared_code_vaults(vaults)
  codes = [tuple(vault_code(v)) for v in range(8)]
  assert shared == {str(v) for v in range(8) if codes.count(codes[v]) > 1}
  assert shared == {"0", "6"}  # the bench's trained vaults: both "gold || red || red"
  rec = _record("A", 0, 0.25)  # right on vaults 0 and 1
  assert vault_report.figures(rec)["greedy_own_code"] == 1 / 6  # vault 1 of the six


def test_the_report_shows_the_post_hoc_table_only_where_vaults_share_a_code(tmp_path):
  """Trained vaults 0-7 (0 and 6 share a code): the report adds the post-hoc table; the distinct
  codes' vaults (0-5, 7, 8): one table, whose greedy column is the primary measure."""
  for name, vaults in (("shared", range(8)), ("distinct", (0, 1, 2, 3, 4, 5, 7, 8))):
    (tmp_path / name / "arms").mkdir(parents=True)
    for arm, seed, greedy in (("D", 0, 0.0), ("D", 1, 0.0), ("F", 0, 0.25), ("F", 1, 0.5)):
      rec = _record(arm, seed, greedy)
      for part in ("trained", "trained_with_tips"):
        rec["scores"][part] = dict(zip([str(v) for v in vaults], rec["scores"][part].values()))
      (tmp_path / name / "arms" / f"{arm}_s{seed}.json").write_text(json.dumps(rec))
  assert "post hoc" in vault_report.report(str(tmp_path / "shared"))
  short = {**_record("F", 2, 1.0), "iterations": 10}  # stopped after 2 of 10 iterations
  (tmp_path / "distinct" / "arms" / "F_s2.json").write_text(json.dumps(short))
  distinct = vault_report.report(str(tmp_path / "distinct"))
  assert "post hoc" not in distinct and "| F | 2 | 0.375 | +0.375 [" in distinct
  assert "stopped before their last iteration (delete and rerun them): F_s2 (2 of 10)" in distinct


def test_an_arm_seed_stopped_short_writes_no_record_and_a_whole_one_does(tmp_path, monkeypatch):
  """SIGTERM ends a trainer's run early with `preempted` set: the bench must not record that
  arm-seed (its scores would be of a partly trained model) and says so; a run that finishes is
  recorded with one metrics row per iteration."""
  import contextlib

  from empo2_jax.defaults import load_config
  from empo2_jax.train import vault_bench

  class Stub:
    def __init__(self, done, total):
      self.iteration, self.preempted, self.total = done, done < total, total

    def run(self):
      return [{"iteration": i, "success": 0.5} for i in range(self.iteration)]

  c = load_config(os.path.join(ROOT, "configs", "vault.py:tiny"))
  bench = vault_bench.Bench(c, str(tmp_path / "root"), str(tmp_path / "rec"))
  done = {"n": 1}
  monkeypatch.setattr(bench, "_trainer", lambda cfg, *_: contextlib.nullcontext(Stub(done["n"], 3)))
  monkeypatch.setattr(bench, "_scores", lambda trainer: {"trained": {}, "unseen": {}})
  with pytest.raises(vault_bench.Preempted, match="stopped after iteration 1 of 3"):
    bench.arm("D", 0, iterations=3)
  assert not (tmp_path / "rec" / "arms" / "D_s0.json").exists()
  done["n"] = 3
  rec = bench.arm("D", 0, iterations=3)
  assert rec["iterations"] == 3 and len(rec["metrics"]) == 3
  assert (tmp_path / "rec" / "arms" / "D_s0.json").exists()
