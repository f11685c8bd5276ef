"""The README quotes the CPU demo's last line as launch/train.py prints it: the same fields in the
same order (empo2_jax/train/summary.done_line over the keys the demo's last iteration holds), the
demo config's iteration count and workdir, and the peak memory the README states elsewhere is the
line's peak_rss_gib."""

import pathlib
import re

from empo2_jax import defaults
from empo2_jax.train import summary
from tests.helpers import markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _readme_line() -> str:
  blocks, _ = markdown.parse((ROOT / "README.md").read_text())
  lines = [ln for b in blocks for ln in b.lines if ln.startswith("done iterations=")]
  assert len(lines) == 1, lines
  return lines[0]


def test_readme_demo_line_has_the_fields_of_the_demo_line():
  line = _readme_line()
  fields = dict(f.split("=", 1) for f in line.split()[1:])
  c = defaults.load_config("configs/sciworld.py:cpu")
  # the demo's last iteration evaluates (eval_at_end) and keeps a memory: every summary key
  assert c.train.eval_at_end and c.method == "empo2"
  printed = summary.done_line([{k: 0.5 for k in summary.SUMMARY_KEYS}] * 3, "runs/cpu", 1.0)
  expected = [f.split("=", 1)[0] for f in printed.split()[1:]]
  assert list(fields) == expected
  assert fields["iterations"] == str(c.train.iterations) and fields["workdir"] == "runs/cpu"
  train = re.search(r"^train:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
  assert "--config=configs/sciworld.py:cpu --workdir=runs/cpu" in train  # what `make train` runs


def test_readme_memory_figure_is_the_demo_lines_peak():
  text = (ROOT / "README.md").read_text()
  peak = _readme_line().split("peak_rss_gib=")[1]
  stated = re.findall(r"peak ([\d.]+) GiB", text)
  assert stated and all(s == peak for s in stated), (stated, peak)
