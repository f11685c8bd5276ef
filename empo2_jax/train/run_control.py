"""What a training run does around its iterations, beside the algorithm (train/trainer.py):
the loop itself (evaluation, records and checkpoints between iterations), the preemption notice
(SIGTERM), the stop that every host agrees on, and the profiler trace of one iteration.

    history = run_loop(trainer, iterations)        # Trainer.run

    stop = StopSignal(lambda: trainer.iteration, deadline_s=25)   # installs the SIGTERM handler
    ...
    stop.check_turn()                              # a turn boundary: Preempted when stopping there
    if stop.requested():                           # once per iteration, on every host
      checkpoint(); break
    stop.close()                                   # the old handler back

Preemption (train.stop_at, train.stop_deadline_s). A Spot or preemptible TPU VM gets a notice of
tens of seconds; an iteration at 7B takes minutes. Once iterations are long (one took longer than
the deadline, or stop_at=turn), every iteration is checkpointed (async where the backend allows:
the write overlaps the next iteration), and a SIGTERM stops the run at the next turn boundary of
the training rollout (raising Preempted: nothing of the iteration in progress has touched the
trainer's state yet), waits only for the save in flight and exits; a watchdog armed by the
signal ends the process at the deadline wherever it is (a long update step, an evaluation), so a
preemption loses at most the iteration in progress, and the rerun resumes exactly from the last
complete checkpoint. Shorter iterations (and every multi-host run, whose hosts must agree on the
iteration they stop after) finish the iteration in progress, checkpoint it and exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Callable, Optional

import numpy as np

import jax

from empo2_jax import remote
from empo2_jax.train import faults
from empo2_jax.train.hoststats import CompileCounter, iteration_host_metrics

log = logging.getLogger("empo2_jax")


STOP_AT = ("auto", "turn", "iteration")  # train.stop_at


class Preempted(Exception):
  """SIGTERM stopped the run at a turn boundary of the training rollout; the iteration in
  progress is dropped (the trainer's state is still the last completed iteration's)."""


class StopSignal:
  """SIGTERM (a TPU VM's preemption notice) asks the run to stop: after the iteration in
  progress, or, once `at_turns` is set (long iterations, one process), at the next turn boundary
  (`check_turn`) with a watchdog that ends the process `deadline_s` seconds after the signal
  (`on_deadline` first: e.g. killing the env workers). The handler is installed from the main
  thread only (Python's signal rule; a trainer built in another thread gets none) and `close`
  puts the previous one back. `iteration()` gives the iterations done so far, for the log."""

  def __init__(
    self,
    iteration: Callable[[], int],
    deadline_s: float = 25.0,
    on_deadline: Optional[Callable[[], None]] = None,
  ):
    self.received = False  # SIGTERM reached this process
    self.received_at: Optional[float] = None  # time.monotonic() of the first SIGTERM
    self.at_turns = False  # stop at a turn boundary, within deadline_s (run_loop sets it)
    self.deadline_s = float(deadline_s)
    self._iteration = iteration
    self._on_deadline = on_deadline
    self._timer: Optional[threading.Timer] = None
    self._old = None
    if threading.current_thread() is threading.main_thread():
      self._old = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    if self.received:
      return
    self.received, self.received_at = True, time.monotonic()
    if not self.at_turns:
      log.warning("SIGTERM: checkpointing after iteration %d, then exiting", self._iteration() + 1)
      return
    log.warning(
      "SIGTERM: stopping at the next turn boundary (iteration %d is dropped; checkpoint %d is "
      "the last complete one), exiting within %.0f s",
      self._iteration() + 1,
      self._iteration(),
      self.deadline_s,
    )
    self._timer = threading.Timer(self.deadline_s, self._expire)
    self._timer.daemon = True
    self._timer.start()

  def _expire(self) -> None:
    """The deadline passed before the run stopped: end the process now (exit status 0, as a
    preempted run); a save still in flight is left incomplete and the rerun skips it."""
    print(
      f"preempted (SIGTERM): stop deadline of {self.deadline_s:g} s reached in iteration "
      f"{self._iteration() + 1}; exiting now, a rerun resumes from the newest complete checkpoint",
      flush=True,
    )
    with contextlib.suppress(Exception):
      if self._on_deadline is not None:
        self._on_deadline()
    os._exit(0)

  def check_turn(self) -> None:
    """A turn boundary of the training rollout: Preempted when a SIGTERM asked to stop there."""
    if self.at_turns and self.received:
      raise Preempted(f"stopped in iteration {self._iteration() + 1} at a turn boundary")

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
    if self._timer is not None:
      self._timer.cancel()
      if self._timer is not threading.current_thread():
        self._timer.join(5)
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)
      self._old = None


def long_iterations(c, seconds: Optional[float]) -> bool:
  """Whether SIGTERM stops at a turn boundary and every iteration is checkpointed: stop_at=turn,
  or auto once an iteration took longer than stop_deadline_s (`seconds`: the last one's, None
  when none is known). One process only: a pod's hosts stop after the same iteration."""
  if jax.process_count() > 1 or c.train.stop_at == "iteration":
    return False
  return c.train.stop_at == "turn" or (
    seconds is not None and seconds > float(c.train.stop_deadline_s)
  )


def _last_iteration_seconds(trainer) -> Optional[float]:
  """time/iteration of the last iteration in the run's records (a resumed run), else None."""
  from empo2_jax.train.checkpoint import read_records

  if not trainer.iteration:
    return None
  records = read_records(trainer.workdir, upto=trainer.iteration)
  return records[-1].get("time/iteration") if records else None


def run_loop(trainer, total: int) -> list[dict]:
  """trainer.train_iteration until `total` iterations are done; after each, evaluation
  (train.eval_every, eval_at_end, eval_with_memory), the records (process 0: metrics.jsonl and
  the episodes), and a checkpoint every train.checkpoint_every, at the end and on a stop request
  (SIGTERM on any host: then trainer.preempted). The trainer is closed at the end, also on
  an error. The metrics of each iteration."""
  c = trainer.config
  history = []
  every_ckpt = c.train.checkpoint_every
  stop_signal = trainer.stop_signal
  try:
    CompileCounter.install()
    stop_signal.at_turns = long_iterations(c, _last_iteration_seconds(trainer))
    while trainer.iteration < total:
      t0 = time.perf_counter()
      compiles0, compile_s0 = CompileCounter.totals()
      try:
        with maybe_profile(trainer.workdir, trainer.iteration + 1, c.train.profile_iteration):
          result = trainer.train_iteration()
      except Preempted as e:  # the state is iteration `trainer.iteration`'s, checkpointed
        trainer.checkpointer.wait()  # the save in flight (the watchdog bounds the wait)
        trainer.preempted, trainer.stop_note = True, str(e)
        log.warning(
          "%s after %.1f s; exiting", e, time.monotonic() - (stop_signal.received_at or 0)
        )
        break
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
      stop = stop_signal.requested()  # multi-host: every host the same answer
      # long iterations: every one checkpointed, so a stop at a turn boundary loses only the next
      stop_signal.at_turns = long_iterations(c, m["time/iteration"])
      periodic = every_ckpt and trainer.iteration % every_ckpt == 0
      if stop or last or periodic or stop_signal.at_turns:
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
