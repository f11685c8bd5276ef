"""Every benchmark starts: each bench/*.py parses its arguments and imports what it needs
(`--help`), and the benches that read repository files or the simulator (data loading) run at
their smallest size, so a moved file or a renamed import breaks a test, not a user's figure.
Benches print figures; nothing here checks them."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHES = sorted(p.name for p in (ROOT / "bench").glob("[a-z]*.py"))

# The smallest run of the benches that load data (texts from tests/; ScienceWorld gold episodes
# through the tokenizer's chat template; the sampler's real weights), and the first word of its
# last line. Each takes ~1.5 min on 2 loaded cores; prompt_growth.py's smallest run (4 min) is
# left to its --help.
SMALL = {
  "memory.py": (["--sizes", "1000", "--queries", "5"], "memory"),
  "packing.py": (["--episodes", "1", "--min_turns", "2", "--tokens_only"], "packing"),
  # the real model's first layer: its where-the-time-goes lines and decode_dots_ms probe run
  "sampler.py": (
    ["--layers", "1", "--rows", "2", "--prompt", "100", "--growth", "40", "--new", "4"]
    + ["--turns", "1", "--skip-reprefill", "--skip-hf"],
    "sampler",
  ),
}


def _bench(name, *args, timeout=600):
  return subprocess.run(
    [sys.executable, str(ROOT / "bench" / name), *args],
    capture_output=True,
    text=True,
    cwd=ROOT,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    timeout=timeout,
  )


def test_every_bench_is_found():
  assert len(BENCHES) >= 10 and "memory.py" in BENCHES and "_common.py" not in BENCHES
  assert set(SMALL) <= set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_bench_parses_its_arguments(name):
  out = _bench(name, "--help", timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "usage:" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_bench_runs_at_its_smallest_size(name):
  args, first_word = SMALL[name]
  out = _bench(name, *args)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1].split()[0] == first_word, out.stdout[-2000:]
