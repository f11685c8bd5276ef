"""What a training run does around its iterations, beside the algorithm (train/trainer.py):
the loop itself (evaluation, records and checkpoints between iterations), the preemption notice
(SIGTERM), the stop that every host agrees on, and the profiler trace of one iteration.

    history = run_loop(trainer, iterations)        # Trainer.run

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
import time
from typing import Callable

import numpy as np

import jax

from empo2_jax import remote
from empo2_jax.train import faults
from empo2_jax.train.hoststats import CompileCounter, iteration_host_metrics

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


def run_loop(trainer, total: int) -> list[dict]:
  """trainer.train_iteration until `total` iterations are done; after each, evaluation
  (train.eval_every, eval_at_end, eval_with_memory), the records (process 0: metrics.jsonl and
  the episodes), and a checkpoint every train.checkpoint_every, at the end and on a stop request
  (SIGTERM on any host: then trainer.preempted). The trainer is closed at the end, also on
  an error. The metrics of each iteration."""
  c = trainer.config
  history = []
  every_ckpt = c.train.checkpoint_every
  try:
    CompileCounter.install()
    while trainer.iteration < total:
      t0 = time.perf_counter()
      compiles0, compile_s0 = CompileCounter.totals()
      with maybe_profile(trainer.workdir, trainer.iteration + 1, c.train.profile_iteration):
        result = trainer.train_iteration()
      m = result.metrics
      trainer.iteration += 1
      every = c.train.eval_every
      last = trainer.iteration == total
      if (every and trainer.iteration % every == 0) or (last and c.train.eval_at_end):
        m.update(trainer.evaluate(False))
        if c.train.eval_with_memory:
          m.update(trainer.evaluate(True))
      m["time/iteration"] = time.perf_counter() - t0
      m.update(iteration_host_metrics(trainer.phase_peaks, compiles0, compile_s0))
      # Multi-host: every host holds the same metrics and episodes; process 0 writes them.
      if jax.process_index() == 0:
        try:
          trainer.metrics.write(trainer.iteration, m)
          if trainer.episode_log is not None:
            trainer.episode_log.write(trainer.iteration, result.episodes)
        except OSError as e:  # disk full: stop, naming the checkpoint a rerun resumes from
          what = f"the metrics and episodes of iteration {trainer.iteration}"
          raise faults.write_error(trainer, what, e) from e
      del result  # its host batch and episodes go before the next iteration builds its own
      history.append(m)
      stop = trainer.stop_signal.requested()  # multi-host: every host the same answer
      if stop or last or (every_ckpt and trainer.iteration % every_ckpt == 0):
        trainer.save_checkpoint(wait=stop)
      if stop:
        trainer.preempted = trainer.iteration < total
        break
    if trainer.episode_log is not None and not trainer.preempted and jax.process_index() == 0:
      trainer.episode_log.build_dataset()
  finally:
    trainer.close()
  return history


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
