"""What a training run does around its iterations, beside the algorithm (train/trainer.py):
the preemption notice (SIGTERM), the stop that every host agrees on, and the profiler trace of
one iteration.

    stop = StopSignal(lambda: trainer.iteration)   # installs the SIGTERM handler
    ...
    if stop.requested():                           # once per iteration, on every host
      checkpoint(); break
    stop.close()                                   # the old handler back
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Callable

import numpy as np

import jax

from empo2_jax import remote

log = logging.getLogger("empo2_jax")


class StopSignal:
  """SIGTERM (a TPU VM's preemption notice) asks the run to checkpoint after the iteration in
  progress and stop. The handler is installed from the main thread only (Python's signal rule;
  a trainer built in another thread gets none) and `close` puts the previous one back.
  `iteration()` gives the iterations done so far, for the log line."""

  def __init__(self, iteration: Callable[[], int]):
    self.received = False  # SIGTERM reached this process
    self._iteration = iteration
    self._old = None
    if threading.current_thread() is threading.main_thread():
      self._old = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    log.warning("SIGTERM: checkpointing after iteration %d, then exiting", self._iteration() + 1)
    self.received = True

  def requested(self) -> bool:
    """Whether to checkpoint and stop after this iteration: SIGTERM reached ANY host. Every host
    calls this once per iteration (a collective: the flags are OR-ed across hosts), so on a pod
    all hosts checkpoint the same iteration and exit together instead of one host leaving the
    others hanging in the next collective."""
    if jax.process_count() == 1:
      return self.received
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.array([self.received], np.int32))
    stop = bool(np.asarray(flags).any())
    if stop and not self.received:
      log.warning("SIGTERM on another host: checkpointing after iteration %d", self._iteration())
    return stop

  def close(self) -> None:
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)
      self._old = None


def maybe_profile(workdir: str, iteration: int, profile_iteration: int):
  """A jax.profiler trace (TensorBoard / Perfetto) into <workdir>/profile when `iteration` is
  train.profile_iteration (process 0 only); otherwise a no-op context."""
  if iteration != profile_iteration or jax.process_index() != 0:
    return contextlib.nullcontext()
  path = os.path.join(workdir, "profile")
  log.info("profiling iteration %d into %s", iteration, path)
  return _trace(path)


@contextlib.contextmanager
def _trace(path):
  """jax.profiler.trace into `path`. A gs:// path gets a local trace, uploaded when the block
  ends (remote.writable_dir): the profiler's own GCS writer is not etils/gcsfs (its own client
  and credentials, no emulator)."""
  with remote.writable_dir(path) as local, jax.profiler.trace(local):
    yield
