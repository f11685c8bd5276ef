"""Per-iteration host figures: compile counting and resident memory."""

import os

import jax
import jax.numpy as jnp

import numpy as np
import pytest

from empo2_jax.train.hoststats import (
  CompileCounter,
  PhasePeaks,
  peak_rss_gib,
  release_host_memory,
)


def test_compile_counter_counts_new_shapes_only():
  CompileCounter.install()
  CompileCounter.install()  # idempotent: one listener, not two

  @jax.jit
  def f(x):
    return jnp.sin(x) * 3.0 + 1.0

  a, b = jnp.ones(7), jnp.ones(9)  # created first: making them compiles too
  n0, s0 = CompileCounter.totals()
  f(a).block_until_ready()
  n1, s1 = CompileCounter.totals()
  f(a).block_until_ready()  # cached: no compile
  n2, _ = CompileCounter.totals()
  f(b).block_until_ready()  # new shape: a compile
  n3, _ = CompileCounter.totals()
  assert n1 - n0 == 1 and s1 > s0
  assert n2 == n1
  assert n3 - n2 == 1


def _vm_rss_gib():
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_phase_peaks_split_the_peak_by_phase():
  peaks = PhasePeaks()
  base = release_host_memory()
  size = 400 * 2**20  # 400 MiB, written so that every page is resident
  with peaks.phase("big"):
    a = np.ones(size // 8)
    del a
  release_host_memory()
  with peaks.phase("small"):
    b = np.ones(size // 80)  # 40 MiB
    del b
  with peaks.phase("small"):  # a phase seen twice keeps its larger peak
    pass
  got = peaks.pop()
  assert set(got) == {"host/peak_rss_gib/big", "host/peak_rss_gib/small"}
  assert got["host/peak_rss_gib/big"] >= base + 0.95 * size / 2**30
  # the mark was reset at "small"'s start: its peak is far below the 400 MiB one
  assert got["host/peak_rss_gib/small"] < got["host/peak_rss_gib/big"] - 0.5 * size / 2**30
  assert peaks.pop() == {}
  # the process-wide peak still counts the 400 MiB the reset took off the kernel's mark
  assert peak_rss_gib() >= got["host/peak_rss_gib/big"]


def test_release_host_memory_reports_resident_size():
  before = _vm_rss_gib()
  gib = release_host_memory()
  after = _vm_rss_gib()
  total_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
  assert 0.01 < gib < total_gib
  assert abs(gib - after) < 0.05  # the figure is the size after the release, as /proc reports it
  assert gib <= before + 0.05  # gc + malloc_trim never grow the process


def test_profile_iteration_writes_a_trace_of_that_iteration_only(tmp_path):
  from empo2_jax.train.run_control import maybe_profile

  with maybe_profile(str(tmp_path), 1, profile_iteration=2):
    jnp.cos(jnp.ones(3)).block_until_ready()
  assert not (tmp_path / "profile").exists()
  with maybe_profile(str(tmp_path), 2, profile_iteration=2):
    jnp.cos(jnp.ones(3)).block_until_ready()
  traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0
