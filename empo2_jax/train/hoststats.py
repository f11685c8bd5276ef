"""Host-side process figures per iteration: XLA compiles and resident memory.

`CompileCounter` counts the backend compilations JAX reports (jax.monitoring's
`/jax/core/compile/backend_compile_duration` event) so a run shows when new shapes are compiled
(`host/compiles`, `host/compile_s`): a steady stream of compiles late in a run means the batch
shapes are not bucketed. `release_host_memory` runs after an iteration and returns the resident
size it leaves (`host/rss_gib`). `peak_rss_gib` is the trainer process's peak resident size so far
(`host/peak_rss_gib`, and `peak_rss_gib=` in launch/train.py's `done` line): the kernel's high-water
mark of this process alone. The env workers and their JVMs are separate processes (children of
this one, still running, so RUSAGE_CHILDREN, which counts only children waited for, would miss
them): `children_rss_gib` sums their current resident sizes (`host/children_rss_gib`).
`PhasePeaks` splits the peak by phase (`host/peak_rss_gib/<phase>`: rollout, reflect, explore,
batching, update, eval): Linux's high-water mark, reset at each phase's start after a trim.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
  """Totals of JAX backend compiles since the counter was installed (process-wide)."""

  _lock = threading.Lock()
  _count = 0
  _seconds = 0.0
  _installed = False

  @classmethod
  def install(cls) -> None:
    with cls._lock:
      if cls._installed:
        return
      jax.monitoring.register_event_duration_secs_listener(cls._on_event)
      cls._installed = True

  @classmethod
  def _on_event(cls, event: str, duration: float, **_) -> None:
    if event == _COMPILE_EVENT:
      with cls._lock:
        cls._count += 1
        cls._seconds += float(duration)

  @classmethod
  def totals(cls) -> tuple[int, float]:
    with cls._lock:
      return cls._count, cls._seconds


M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def limit_malloc_arenas(n: int) -> bool:
  """Cap glibc's malloc arenas at n (mallopt M_ARENA_MAX) unless MALLOC_ARENA_MAX is set.

  glibc gives threads their own arenas (up to 8 per core); XLA's, orbax's and the env pool's
  threads each grow one, and their free pages come back to the OS unevenly, so a trainer's RSS
  after `release_host_memory` drifted by up to ~9% between iterations that compiled nothing
  (chaos soak). With 2 arenas it moved by ~1% in three soaks, but for one reading of +4.5%.
  Call before threads start. Returns whether
  the cap was set (False: n <= 0, MALLOC_ARENA_MAX given, or not glibc).
  """
  if n <= 0 or "MALLOC_ARENA_MAX" in os.environ:
    return False
  try:
    return bool(ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, int(n)))
  except (OSError, AttributeError):  # not glibc: nothing to cap
    return False


def release_host_memory() -> float:
  """Frees what the iteration left behind; returns the process's resident memory in GiB.

  glibc keeps freed heap pages mapped (XLA compiles and the host copies of batches allocate and
  free hundreds of MB per iteration), so without a trim the resident size creeps up over a long
  run although nothing is live; `malloc_trim(0)` hands the free pages back to the OS.
  """
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
    pass
  try:
    with open("/proc/self/statm") as f:
      pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30
  except (OSError, ValueError):  # no /proc: the peak resident size instead (bytes on macOS)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def peak_rss_gib() -> float:
  """This process's peak resident size so far in GiB (getrusage ru_maxrss: KiB on Linux, bytes on
  macOS), including the marks PhasePeaks reset: monotone over the process's life."""
  import resource

  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return max(peak / 2**30 if sys.platform == "darwin" else peak / 2**20, _peak_before_resets)


def _high_water_gib() -> float | None:
  """This process's resident high-water mark (VmHWM) in GiB; None without /proc."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2**20  # kB
  except (OSError, ValueError):
    pass
  return None


_peak_before_resets = 0.0  # GiB: the high-water mark as it was before each reset (peak_rss_gib)


def _reset_high_water() -> bool:
  """Resets VmHWM to the current resident size (writing 5 to /proc/self/clear_refs, Linux >= 4.0);
  False where that is not possible. The kernel's getrusage ru_maxrss is the same mark and resets
  with it, so the mark before the reset is kept for peak_rss_gib."""
  global _peak_before_resets
  before = _high_water_gib()
  if before is not None:
    _peak_before_resets = max(_peak_before_resets, before)
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


class PhasePeaks:
  """Peak resident memory per phase of an iteration, where the kernel allows resetting the
  high-water mark (Linux); elsewhere nothing is recorded.

      peaks = PhasePeaks()
      with peaks.phase("update"):
        ...
      metrics.update(peaks.pop())  # {"host/peak_rss_gib/update": 3.1, ...}; then cleared
  """

  def __init__(self):
    self._peaks: dict[str, float] = {}

  @contextlib.contextmanager
  def phase(self, name: str):
    # What the previous phase freed goes back to the OS first (release_host_memory), so the mark
    # starts at what is live and a phase's peak is not the last phase's leftover heap.
    release_host_memory()
    ok = _reset_high_water()
    try:
      yield
    finally:
      peak = _high_water_gib() if ok else None
      if peak is not None:
        self._peaks[name] = max(self._peaks.get(name, 0.0), peak)

  def pop(self) -> dict[str, float]:
    out = {f"host/peak_rss_gib/{k}": v for k, v in self._peaks.items()}
    self._peaks.clear()
    return out


def _children(pid: int) -> list[int]:
  out = []
  try:
    for task in os.listdir(f"/proc/{pid}/task"):
      with open(f"/proc/{pid}/task/{task}/children") as f:
        out += [int(x) for x in f.read().split()]
  except (OSError, ValueError):
    pass
  return out


def children_rss_gib(pid: int | None = None) -> float:
  """Current resident size in GiB of every live descendant of `pid` (default: this process), e.g.
  the env pool's workers and their JVMs; 0.0 without /proc. Shared pages count once per process."""
  total, todo, seen = 0, _children(os.getpid() if pid is None else pid), set()
  while todo:
    child = todo.pop()
    if child in seen:
      continue
    seen.add(child)
    todo += _children(child)
    try:
      with open(f"/proc/{child}/statm") as f:
        total += int(f.read().split()[1])
    except (OSError, ValueError, IndexError):  # exited meanwhile
      pass
  return total * os.sysconf("SC_PAGE_SIZE") / 2**30


def iteration_host_metrics(phase_peaks: PhasePeaks, compiles0: int, compile_s0: float) -> dict:
  """An iteration's host figures: backend compiles and their seconds since the totals
  (compiles0, compile_s0) read at its start, this process's RSS after handing freed memory back,
  its peak, the env processes' RSS, and the peak of each phase (host/peak_rss_gib/<phase>)."""
  compiles, compile_s = CompileCounter.totals()
  return {
    "host/compiles": compiles - compiles0,
    "host/compile_s": compile_s - compile_s0,
    "host/rss_gib": release_host_memory(),
    "host/peak_rss_gib": peak_rss_gib(),  # this process; the env processes: below
    "host/children_rss_gib": children_rss_gib(),
    **phase_peaks.pop(),  # where the peak is
  }
