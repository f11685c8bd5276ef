"""launch/sft.py end to end on the tiny config: gold rows, steps, checkpoint, resume, HF export."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(workdir, *extra):
  cmd = [
    sys.executable,
    os.path.join(ROOT, "launch", "sft.py"),
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py") + ":tiny",
    f"--workdir={workdir}",
    "--config.sft.variations=2",
    "--config.sft.batch_rows=2",
    "--config.sft.max_len=3000",
    "--config.sft.eval_before=False",
    "--config.sft.eval_after=False",
    "--config.sft.lr=1e-3",
    *extra,
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


@pytest.mark.slow
def test_sft_launch_trains_checkpoints_resumes_and_exports(tmp_path):
  from empo2_jax.model import hf

  workdir = str(tmp_path / "sft")
  out = _run(workdir, "--config.sft.steps=2")
  line = next(ln for ln in out.splitlines() if ln.startswith("sft loss_first="))
  first, last = (float(x.split("=")[1]) for x in line.split()[1:3])
  assert last < first
  records = [json.loads(ln) for ln in open(os.path.join(workdir, "sft_metrics.jsonl"))]
  assert [r["step"] for r in records] == [1, 2]
  # The export is a Hugging Face directory launch/train.py can load: config, weights, tokenizer.
  hf_dir = os.path.join(workdir, "sft", "hf")
  assert os.path.exists(os.path.join(hf_dir, "tokenizer.json"))
  config, params = hf.load_checkpoint(hf_dir)
  assert config.num_layers == 2
  summary = json.load(open(os.path.join(workdir, "sft_summary.json")))
  assert summary["hf_dir"] == hf_dir and summary["episodes"] == 2
  # Rerunning with more steps resumes from the saved step instead of starting over.
  out2 = _run(workdir, "--config.sft.steps=3")
  assert "resumed SFT at step 2" in out2
  records = [json.loads(ln) for ln in open(os.path.join(workdir, "sft_metrics.jsonl"))]
  assert [r["step"] for r in records] == [1, 2, 3]
  _, params3 = hf.load_checkpoint(hf_dir)
  moved = max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params3))
  )
  assert moved > 0
