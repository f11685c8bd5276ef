"""Stopping a run on a fault with its files in order, and saying what to do next.

Non-finite update (NonFiniteError): the failing iteration is not checkpointed (its state is
poisoned); the save in flight is waited for, so the newest checkpoint is the last good state the
run saved; the update batch (host arrays, as the update saw them) and the iteration's metrics and
config go to <workdir>/debug/iter_<N>/ for reproducing it:

    batch.npz     the update's batch (rl/minibatch.arrange's layout; np.load(...) gives the dict)
    info.json     iteration, mode, the non-finite metrics, all update/batch/rollout statistics
    config.json   the run's config

Write errors (WriteError): metrics or episodes that cannot be written (disk full) stop the run
with the newest intact checkpoint named; checkpoint saves raise checkpoint.CheckpointSaveError.
"""

from __future__ import annotations

import io
import json
import math
from typing import Optional

import numpy as np
from etils import epath

from empo2_jax.train import checkpoint as ckpt_lib


class NonFiniteError(FloatingPointError):
  """An update produced non-finite metrics; the message names iteration, mode, metrics, files."""

  def __init__(self, message: str, *, iteration=None, mode=None, metrics=(), debug_dir=None):
    super().__init__(message)
    self.iteration, self.mode, self.metrics, self.debug_dir = iteration, mode, metrics, debug_dir


class WriteError(RuntimeError):
  """A run's file could not be written (disk full, ...); the run stopped."""


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.generic, np.ndarray)):
    return _jsonable(x.tolist())
  if isinstance(x, (bool, int, float, str)) or x is None:
    return x
  return str(x)


def write_debug(workdir, iteration: int, batch: dict, info: dict, config) -> epath.Path:
  """<workdir>/debug/iter_<iteration>/{batch.npz, info.json, config.json}; returns the folder."""
  out = epath.Path(workdir) / "debug" / f"iter_{iteration}"
  out.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  np.savez_compressed(buf, **{k: np.asarray(v) for k, v in (batch or {}).items()})
  (out / "batch.npz").write_bytes(buf.getvalue())
  (out / "info.json").write_text(json.dumps(_jsonable(info), indent=1, allow_nan=True) + "\n")
  (out / "config.json").write_text(config.to_json(indent=1) + "\n")
  return out


def newest_checkpoint(trainer) -> tuple[Optional[int], str]:
  """Wait for the save in flight; (newest intact step or None, a note if that save failed)."""
  note = ""
  try:
    trainer.checkpointer.wait()
  except ckpt_lib.CheckpointSaveError as e:
    note = f" (Also: {e})"
  steps = trainer.checkpointer.steps()
  return (max(steps) if steps else None), note


def _resume_hint(trainer, step: Optional[int]) -> str:
  if step is None:
    return "there is no checkpoint yet, so rerunning the same command starts from scratch"
  where = trainer.checkpointer.directory / str(step)
  return (
    f"the newest checkpoint is {where} (iteration {step}); rerunning the same command resumes "
    "from it"
  )


def nonfinite_error(
  trainer, iteration: int, mode: str, bad: dict, info: dict, batch: Optional[dict], lead: bool
) -> NonFiniteError:
  """The error to raise for a non-finite update of (1-based) `iteration`, after writing the debug
  files (process 0: `lead`) and waiting for the save in flight."""
  step, note = newest_checkpoint(trainer)
  where = epath.Path(trainer.workdir) / "debug" / f"iter_{iteration}"
  saved = f"The update batch, metrics and config are in {where} (batch.npz, info.json, config.json)"
  if lead:
    try:
      info = dict(info, iteration=iteration, mode=mode, nonfinite=sorted(bad), checkpoint=step)
      write_debug(trainer.workdir, iteration, batch, info, trainer.config)
    except Exception as e:  # noqa: BLE001 - the disk may be what is failing
      saved = f"Writing the debug files to {where} failed: {ckpt_lib.describe_error(e)}"
  else:
    saved += " (written by process 0)"
  metrics = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
  lr = trainer.config.optim.lr
  msg = (
    f"iteration {iteration} (mode={mode}) produced a non-finite update: {metrics}. The run "
    f"stopped without saving that iteration: {_resume_hint(trainer, step)} but would repeat "
    f"the same update, so lower optim.lr (now {lr:g}) or inspect the batch first. {saved}.{note}"
  )
  return NonFiniteError(msg, iteration=iteration, mode=mode, metrics=sorted(bad), debug_dir=where)


def write_error(trainer, what: str, error: BaseException) -> WriteError:
  """The error to raise when `what` could not be written."""
  step, note = newest_checkpoint(trainer)
  return WriteError(
    f"writing {what} in {trainer.workdir} failed: {ckpt_lib.describe_error(error)}. The run "
    f"stopped; {_resume_hint(trainer, step)}.{note}"
  )


def nonfinite(metrics: dict) -> dict:
  """The entries of `metrics` that are not finite."""
  return {k: v for k, v in metrics.items() if not math.isfinite(v)}


__all__ = ["NonFiniteError", "WriteError", "write_debug", "nonfinite_error", "write_error"]
