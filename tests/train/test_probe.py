"""The distillation probe (train/probe.py): probe samples from episode records, scores against an
unpacked per-sample forward pass, and a probe that can fail: SFT steps on the probe's responses
raise its log-prob, steps on other responses do not."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import optax

from empo2_jax.model import configs, llama
from empo2_jax.model.chat import chat_text
from empo2_jax.model.tokenizer import load_tokenizer
from empo2_jax.rl.update import init_train_state
from empo2_jax.train import probe
from empo2_jax.train.sft import SFTConfig, make_sft_step

TIP = "<tip>Tips: open the door first</tip>\n"


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(None)


def _record(tok, eid, variation, success, use_memory=True, n_turns=3, tips=1, seed=0):
  rng = np.random.default_rng(seed)
  prompts = [f"{TIP * tips}Observation {k} of {eid}. What next?" for k in range(n_turns)]
  actions = [f"go to room {int(rng.integers(1, 9))}" for _ in range(n_turns)]
  ids = [tok(a + "<|im_end|>", add_special_tokens=False)["input_ids"] for a in actions]
  return {
    "episode_id": eid,
    "task": "find-plant",
    "variation": variation,
    "use_memory": use_memory,
    "env_failed": False,
    "success": success,
    "turns": {
      "prompt": prompts,
      "raw_action": actions,
      "num_tips": [tips] * n_turns,
      "num_tokens": [len(x) for x in ids],
    },
    "response_ids": [i for x in ids for i in x],
  }


def _records(tok):
  return [
    _record(tok, "it1-0", 5, True, seed=1),
    _record(tok, "it1-1", 6, False, seed=2),
    _record(tok, "it1-2", 7, True, use_memory=False, seed=3),  # no memory: not a probe episode
    _record(tok, "it1-3", 8, False, tips=0, seed=4),  # memory, but no tip shown
    _record(tok, "it1-4", 9, True, n_turns=2, seed=5),
  ]


def test_probe_records_are_the_tip_free_chats(tok):
  eps = _records(tok)
  recs = probe.probe_records(eps)
  assert [r["id"] for r in recs] == [f"{e}:it1-{e}/{t}" for e in (0, 1) for t in range(3)] + [
    "4:it1-4/0",
    "4:it1-4/1",
  ]
  r = recs[2]  # episode 0, turn 2
  assert [m["role"] for m in r["messages"]] == ["user", "assistant", "user", "assistant", "user"]
  assert all("<tip>" not in m["content"] for m in r["messages"])
  assert r["messages"][-1]["content"] == "Observation 2 of it1-0. What next?"
  assert r["messages"][1]["content"] == eps[0]["turns"]["raw_action"][0]
  n = eps[0]["turns"]["num_tokens"]
  assert r["response_ids"] == eps[0]["response_ids"][n[0] + n[1] :]
  assert probe.summary(recs)["success"] == {"samples": 5, "episodes": 2, "variations": [5, 9]}
  assert [r["variation"] for r in probe.probe_records(eps, variations=[6])] == [6, 6, 6]
  capped = probe.cap_episodes(recs, "success", 1)
  assert {r["episode_id"] for r in capped} == {"0:it1-0", "1:it1-1"}
  # an evaluation in parts numbers each part's episodes from 0: equal episode ids stay apart
  twice = probe.probe_records(eps + eps)
  assert len({r["id"] for r in twice}) == len(twice) == 2 * len(recs)
  assert probe.summary(twice)["success"]["episodes"] == 4
  assert len(probe.cap_episodes(twice, "failed", 1)) == len(twice) - 3
  assert probe.cap_episodes(recs, "success", 0) == recs


def test_probe_file_round_trip_and_bad_sets(tmp_path, tok):
  recs = probe.probe_records(_records(tok))
  probe.write_probe(tmp_path / "p.jsonl", recs)
  assert probe.read_probe(tmp_path / "p.jsonl") == recs
  (tmp_path / "bad.jsonl").write_text('{"id": "x", "set": "maybe"}\n')
  with pytest.raises(ValueError, match="set other than"):
    probe.read_probe(tmp_path / "bad.jsonl")
  with pytest.raises(FileNotFoundError, match="launch/probe.py make"):
    probe.read_probe(tmp_path / "none.jsonl")
  with pytest.raises(ValueError, match="repeats sample ids"):
    probe.score(None, None, tok, recs + recs[:1])


MODEL = configs.get_preset("tiny", param_dtype="float32")


def test_scores_equal_an_unpacked_forward_pass(tok):
  recs = probe.probe_records(_records(tok))
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  out = probe.score(params, MODEL, tok, recs, rows=2)
  assert out["dropped_long"] == 0 and len(out["samples"]) == len(recs)
  for r in (recs[0], recs[2], recs[-1]):  # reference: one sequence, full logits
    prompt = tok(chat_text(tok, r["messages"], add_generation_prompt=True))["input_ids"]
    seq = jnp.asarray([prompt + r["response_ids"]], jnp.int32)
    logits = llama.forward(params, MODEL, seq, jnp.ones_like(seq))[0]
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    pos = np.arange(len(prompt) - 1, seq.shape[1] - 1)
    want = np.asarray(lp)[pos, r["response_ids"]]
    top = np.asarray(jnp.argmax(logits, axis=-1))[pos] == np.asarray(r["response_ids"])
    got = out["samples"][r["id"]]
    np.testing.assert_allclose(got["logp"], want.mean(), rtol=1e-4)
    assert got["top1"] == pytest.approx(top.mean()) and got["tokens"] == len(want)
  s = out["sets"]["success"]
  toks = [out["samples"][r["id"]]["tokens"] for r in recs if r["set"] == "success"]
  assert s["samples"] == 5 and s["tokens"] == sum(toks)
  assert out["sets"]["failed"]["samples"] == 3


def _sft_batch(tok, recs):
  """Every probe sample as one SFT row: its tip-free prompt, the response as the answer."""
  rows = []
  for r in recs:
    prompt = tok(chat_text(tok, r["messages"], add_generation_prompt=True))["input_ids"]
    rows.append((prompt, r["response_ids"]))
  length = max(len(p) + len(a) for p, a in rows)
  batch = {k: np.zeros((len(rows), length), np.int32) for k in ("tokens", "attn", "loss_mask")}
  for b, (p, a) in enumerate(rows):
    batch["tokens"][b, : len(p) + len(a)] = p + a
    batch["attn"][b, : len(p) + len(a)] = 1
    batch["loss_mask"][b, len(p) : len(p) + len(a)] = 1
  return jax.tree.map(jnp.asarray, batch)


def _after_sft(params, batch, steps=4):
  opt = optax.adam(3e-3)
  step = make_sft_step(MODEL, SFTConfig(micro_rows=batch["tokens"].shape[0]), opt)
  state = init_train_state(jax.tree.map(jnp.copy, params), opt)
  for _ in range(steps):
    state, _ = step(state, batch)
  return state.params


def test_probe_rises_after_sft_on_its_responses_and_not_on_other_data(tok):
  recs = probe.probe_records(_records(tok))
  success = [r for r in recs if r["set"] == "success"]
  params = llama.init_params(MODEL, jax.random.PRNGKey(0))
  scorer = probe.make_scorer(MODEL)  # one compiled scorer for the three scores
  before = probe.score(params, MODEL, tok, recs, scorer=scorer)["sets"]
  # "other data": the same prompts answered with unrelated text
  other = [
    dict(r, response_ids=tok("the cat sleeps on a mat<|im_end|>")["input_ids"]) for r in success
  ]
  on_probe = probe.score(
    _after_sft(params, _sft_batch(tok, success)), MODEL, tok, recs, scorer=scorer
  )
  on_other = probe.score(
    _after_sft(params, _sft_batch(tok, other)), MODEL, tok, recs, scorer=scorer
  )
  on_probe, on_other = on_probe["sets"], on_other["sets"]
  gain = on_probe["success"]["logp_mean"] - before["success"]["logp_mean"]
  assert gain > 1.0, (before, on_probe)
  assert on_probe["success"]["top1"] > before["success"]["top1"]
  assert on_other["success"]["logp_mean"] - before["success"]["logp_mean"] < 0.25 * gain


@pytest.mark.slow  # a subprocess with its own JAX compile (~1 min on 2 busy cores)
def test_launch_probe_makes_and_scores_from_a_relative_workdir(tmp_path, tok):
  """launch/probe.py --make from an episodes JSONL, then scoring a run's checkpoint given as a
  relative --workdir: the printed and written figures equal probe.score on the same params."""
  import json
  import os
  import subprocess
  import sys

  from tests.train.test_export import ROOT, _trained_checkpoint

  cfg, params = _trained_checkpoint(str(tmp_path / "run"))
  eps = tmp_path / "with.jsonl"
  eps.write_text("".join(json.dumps(e) + "\n" for e in _records(tok)))
  env = dict(os.environ, JAX_PLATFORMS="cpu")

  def cli(*args):
    cmd = [sys.executable, os.path.join(ROOT, "launch", "probe.py"), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout

  made = cli("--make", f"--episodes={eps}", "--probe=p.jsonl", "--max_failed_episodes=1")
  assert "set=success samples=5 episodes=2" in made and "set=failed samples=3 episodes=1" in made
  printed = cli("--workdir=run", "--probe=p.jsonl", "--out=score.json")
  got = json.loads((tmp_path / "score.json").read_text())
  want = probe.score(params, cfg, tok, probe.read_probe(tmp_path / "p.jsonl"))
  assert got["step"] == 2 and got["kind"] == "rl"
  for s in ("success", "failed"):
    np.testing.assert_allclose(got["sets"][s]["logp_mean"], want["sets"][s]["logp_mean"], 1e-5)
    assert f"set={s} samples={want['sets'][s]['samples']}" in printed
