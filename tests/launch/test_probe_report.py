"""scripts/probe_report.py: the A-D table's differences and intervals from fake records."""

import json
import os
import subprocess
import sys

import numpy as np
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _score(path, success, failed, top1=0.5):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  sets = {
    "success": {"logp_mean": success, "top1": top1, "samples": 10},
    "failed": {"logp_mean": failed, "top1": 0.1, "samples": 7},
  }
  with open(path, "w") as f:
    json.dump({"sets": sets}, f)


def test_report_differences_against_the_start_d_and_a(tmp_path):
  _score(tmp_path / "scores" / "start.json", -2.0, -3.0)
  a = {0: -1.5, 1: -1.0, 2: -1.3}  # success-set logp at the end
  d = {0: -1.9, 1: -1.8, 2: -2.1}
  for s in range(3):
    _score(tmp_path / "scores" / f"A_s{s}.json", a[s], -3.1)
    _score(tmp_path / "scores" / f"D_s{s}.json", d[s], -2.9)
  run = tmp_path / "arms" / "A_s0"
  run.mkdir(parents=True)
  rows = [{"view/off/samples": 10, "view/off/masked": 4, "view/off/pos_adv": 5,
           "view/off/masked_pos_adv": 3, "view/off/dropped_long": 1}] * 2  # fmt: skip
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = subprocess.run(
    [sys.executable, os.path.join(ROOT, "scripts", "probe_report.py"), str(tmp_path),
     "--arms=A D"], capture_output=True, text=True, check=True,
  ).stdout  # fmt: skip
  line_a = next(x for x in out.splitlines() if x.startswith("| A |"))
  cells = [c.strip() for c in line_a.strip("|").split("|")]
  gains = np.array([a[s] + 2.0 for s in range(3)])
  assert cells[1] == "3"
  assert cells[2] == f"{gains.mean():.3f} ± {gains.std(ddof=1) / np.sqrt(3):.3f}"
  diff = np.array([a[s] - d[s] for s in range(3)])
  half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
  want = f"{diff.mean():+.3f} [{diff.mean() - half:+.3f}, {diff.mean() + half:+.3f}]"
  assert cells[5] == want
  assert cells[8] == "8 / 20" and cells[9] == "6 / 10" and cells[10] == "2"
