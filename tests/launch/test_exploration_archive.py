"""scripts/exploration_experiment.sh archive / sft's start check: the records the report needs
survive a checkout (docs/explore/), read back by the same readers, and a rebuilt SFT start that
differs from the archived one is refused. A fake experiment root stands in for the runs."""

import importlib.metadata
import json
import os
import subprocess
import sys

from empo2_jax.baselines.results import read_results
from empo2_jax.data import episodes_html
from empo2_jax.train import compare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "exploration_experiment.sh")
TASK = "find-non-living-thing"


def _episode(it, rid, memory, tip, shown):
  return {
    "episode_id": f"it{it:08d}-{rid:05d}",
    "iteration": it,
    "task": TASK,
    "variation": rid % 2,
    "group_id": 0,
    "rollout_id": rid,
    "mode": "off" if memory else "none",
    "use_memory": memory,
    "score": 25.0,
    "success": False,
    "env_failed": False,
    "tip": tip,
    "tips": shown,
    "turns": {
      "observation": ["a long observation"] * 2,
      "prompt": ["a long prompt " * 50] * 2,
      "raw_action": ["look around", "open door"],
      "executed_action": ["look around", "open door to kitchen"],
      "reward": [0.0, 8.0],
      "intrinsic": [0.5, 0.3],
      "advantage": [0.1, 0.1],
      "num_tips": [1, 0] if memory else [0, 0],
      "num_tokens": [3, 4],
    },
    "response_ids": list(range(7)),
    "sampler_logprobs": [-0.5] * 7,
  }


def _fake_root(tmp_path):
  root = tmp_path / "runs"
  run = root / "arms" / TASK / "empo2_s1"
  (run / "episodes" / "staging").mkdir(parents=True)
  (run / "metrics.jsonl").write_text('{"step": 1, "train/return_mean": 22.0}\n')
  for it in (1, 2):
    eps = [_episode(it, 0, it == 2, "open the door", ["go to kitchen"] if it == 2 else [])]
    eps.append(_episode(it, 1, False, "", []))
    lines = "".join(json.dumps(e) + "\n" for e in eps)
    (run / "episodes" / "staging" / f"iter-{it:08d}.jsonl").write_text(lines)
  ev = root / "eval" / TASK / "it6" / "empo2_s1"
  (ev / "eval").mkdir(parents=True)
  rec = {"method": "empo2", "seed": 1, "variations": [75, 76], "returns": [22.0, 100.0]}
  rec.update(successes=[False, True], split="test", iteration=6)
  (ev / "eval" / "result.json").write_text(json.dumps(rec))
  hf = root / "sft" / "sft" / "hf"
  hf.mkdir(parents=True)
  (hf / "model.safetensors").write_bytes(b"weights")
  (hf / "config.json").write_text("{}")
  (root / "sft" / "sft_summary.json").write_text('{"steps": 20}')
  return root, run


def _script(step, root, archive, check=True):
  env = dict(os.environ, PY=sys.executable, ROOT=str(root), ARCHIVE=str(archive), PYTHONPATH=ROOT)
  return subprocess.run(
    ["bash", SCRIPT, step], env=env, capture_output=True, text=True, cwd=ROOT, check=check
  )


def test_archive_keeps_what_the_report_reads(tmp_path):
  root, run = _fake_root(tmp_path)
  archive = tmp_path / "archive"
  out = _script("archive", root, archive)
  assert "archived 1 evaluations and 1 training runs" in out.stdout
  # the evaluation reads back identically, through the report's own reader
  (got,) = read_results([str(archive / "eval" / TASK / "it6")])
  assert got["returns"] == [22.0, 100.0] and got["seed"] == 1
  # the trimmed episodes give the same tip usage as the full ones, without prompts or ids
  kept = archive / "arms" / TASK / "empo2_s1"
  full, trimmed = episodes_html.read_records(run), episodes_html.read_records(kept)
  assert compare.tip_usage(trimmed) == compare.tip_usage(full)
  assert compare.tip_usage(trimmed)["steps_with_tips"] == 1
  assert all("prompt" not in e["turns"] and "response_ids" not in e for e in trimmed)
  assert trimmed[0]["turns"]["executed_action"] == ["look around", "open door to kitchen"]
  assert (kept / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
  sft = json.loads((archive / "sft.json").read_text())
  assert set(sft["hf_sha256"]) == {"model.safetensors", "config.json"}
  assert sft["summary"] == {"steps": 20}
  head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
  assert sft["code_commit"] == head.stdout.strip()  # the code that ran: PYTHONPATH's checkout
  assert sft["machine"]["jaxlib"] == importlib.metadata.version("jaxlib")
  assert isinstance(sft["machine"]["cpu"], str) and sft["machine"]["cpu"]


def test_a_different_sft_start_is_refused(tmp_path):
  root, _ = _fake_root(tmp_path)
  archive = tmp_path / "archive"
  _script("archive", root, archive)
  ok = _script("sft", root, archive)  # sft_summary.json exists: not rebuilt, only checked
  assert "matches" in ok.stdout
  (root / "sft" / "sft" / "hf" / "model.safetensors").write_bytes(b"other weights")
  bad = _script("sft", root, archive, check=False)
  assert bad.returncode != 0 and "model.safetensors" in bad.stderr
  built_on = json.loads((archive / "sft.json").read_text())["machine"]
  assert f"({built_on}; this one: " in bad.stderr  # the machine kinds, side by side
  again = _script("archive", root, archive, check=False)  # nor is it archived over the old one
  assert again.returncode != 0 and "differs" in again.stderr


def test_unknown_step_says_the_valid_ones(tmp_path):
  out = _script("bogus", tmp_path, tmp_path, check=False)
  assert out.returncode == 2 and "archive" in out.stderr
