"""Preemption-safe training checkpoints with orbax (docs/method.md §1's loop state, nothing less).

    ckpt = Checkpointer(workdir + "/checkpoints", keep=3)
    step = restore_trainer(ckpt, trainer)        # None: nothing to resume, start from scratch
    save_trainer(ckpt, trainer)                  # step = trainer.iteration (completed iterations)
    ckpt.close()                                 # waits for the async save in flight

One checkpoint step holds three orbax items:
  state   params, optimizer state and optimizer step (rl.update.TrainState) and the base RNG key;
          with RND (methods/rnd.py) also its networks, Adam state and running statistics; with
          LoRA the adapters instead of the params (saved_train_state: the base by reference)
  memory  the tip memory (MemoryStore.state_dict() as one npz blob: orbax cannot save the empty
          arrays of an empty memory)
  meta    JSON: iteration, variation cursor, the config, the metrics records up to this iteration
Per-iteration keys are fold_in(rng, iteration) and rows come from the cursor, so these few numbers
are the whole loop state; the reference policy (KL) is rebuilt from the config like the first time.

Saves are async (the device->host copy blocks, the writes do not). orbax writes a step into a
temporary directory and renames it when complete (GCS: a commit marker), so a process killed
mid-save leaves no step that looks complete. A step that looks complete but does not restore
(truncated or deleted files) is moved aside to `corrupt-<step>-<time>` with a warning naming it,
and the step before is tried. Paths go through etils.epath, so a gs:// workdir works like a local
one.

A save that fails (disk full, quota, permissions; in the blocking part or in the async writes, which
surface on the next save, wait() or close()) raises CheckpointSaveError naming the step, the cause
and the newest earlier step, which stays intact: orbax deletes old steps (keep) only after the new
one is complete, and the failed step's temporary directory is removed on the next start.

Exact resume (tests/integration/test_checkpoint_resume.py): everything random is keyed by (seed,
iteration) or restored above; the memory index is rebuilt from the restored store (exact search,
which every slot up to RetrievalConfig.exact_max entries uses, depends only on the store; a ScaNN
searcher of a larger slot is rebuilt at a different moment than in the uninterrupted run, so its
approximate answers may differ). ScienceWorld lists objects in identity-hash order, which depends on
what the JVM did before; configs/base.py starts the JVMs with -XX:hashCode=2 so a fresh JVM shows
the same observations.
Not restored: TensorBoard events past the checkpoint (the viewer shows the rewritten steps twice).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import threading
import time
from typing import Any, Optional

import numpy as np

import jax
import orbax.checkpoint as ocp
from etils import epath

from empo2_jax import config_keys
from empo2_jax.memory.store import MemoryStore
from empo2_jax.model import lora

log = logging.getLogger("empo2_jax")
FORMAT_VERSION = 1
STATE, MEMORY, META = "state", "memory", "meta"
METRICS_FILE = "metrics.jsonl"


# -- memory <-> one uint8 array --------------------------------------------------------------------
def memory_to_blob(store: MemoryStore) -> np.ndarray:
  buf = io.BytesIO()
  np.savez(buf, **store.state_dict())
  return np.frombuffer(buf.getvalue(), np.uint8).copy()


def memory_from_blob(blob) -> MemoryStore:
  with np.load(io.BytesIO(np.asarray(blob, np.uint8).tobytes())) as z:
    return MemoryStore.from_state_dict({k: z[k] for k in z.files})


def read_memory(workdir) -> tuple[int, MemoryStore]:
  """(step, memory) of the newest checkpoint under <workdir>/checkpoints, read-only (the run may
  still be training): what config.memory.init_from starts a run with."""
  directory = epath.Path(workdir) / "checkpoints"
  steps = (
    sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    if directory.is_dir()
    else []
  )
  if not steps:
    raise FileNotFoundError(
      f"memory.init_from={workdir!r}: no checkpoint in {directory}; pass the workdir of a "
      "launch/train.py run that has saved one"
    )
  mgr = ocp.CheckpointManager(
    directory,
    item_handlers={MEMORY: ocp.StandardCheckpointHandler()},
    options=ocp.CheckpointManagerOptions(create=False, read_only=True),
  )
  try:
    out = mgr.restore(steps[-1], args=ocp.args.Composite(**{MEMORY: ocp.args.StandardRestore()}))
  finally:
    mgr.close()
  return steps[-1], memory_from_blob(out[MEMORY]["npz"])


# -- metrics.jsonl (the record of iterations before the restored step) -----------------------------
def read_records(workdir, upto: Optional[int] = None) -> list[dict]:
  path = epath.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  out = []
  for line in path.read_text().splitlines():
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except json.JSONDecodeError:  # a line cut by the kill: later iterations are re-run
      break
    if upto is None or rec.get("iteration", 0) <= upto:
      out.append(rec)
  return out


def rewrite_records(workdir, records: list[dict]) -> None:
  """metrics.jsonl := exactly `records` (the lines past the restored iteration are dropped)."""
  path = epath.Path(workdir) / METRICS_FILE
  tmp = path.parent / f".{METRICS_FILE}.tmp"
  tmp.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
  tmp.replace(path)


CHECKPOINT_ASYNC = ("auto", "always", "never")  # config train.checkpoint_async


def async_saves(setting: str, backend: str) -> bool:
  """Whether saves are async for train.checkpoint_async=`setting` on `backend` (jax's platform):
  "auto" is async except on "cpu", where the async save's host copy doubles the saved state in
  RAM until the write ends; a synchronous save writes from the live arrays."""
  if setting not in CHECKPOINT_ASYNC:
    raise ValueError(
      f"train.checkpoint_async={setting!r}; valid: auto (async except on a CPU backend), "
      "always, never"
    )
  return setting == "always" or (setting == "auto" and backend != "cpu")


# -- the checkpointer ------------------------------------------------------------------------------
class Checkpointer:
  """An orbax CheckpointManager over `directory` with the fallback restore described above."""

  def __init__(self, directory, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"train.keep_checkpoints must be >= 1, got {keep}")
    self.directory = epath.Path(directory)
    self.keep, self.async_save = int(keep), bool(async_save)
    self._mgr: Optional[ocp.CheckpointManager] = None
    self._pending: Optional[tuple] = None  # (step, the step before) of the save in flight

  @property
  def manager(self) -> ocp.CheckpointManager:
    if self._mgr is None:
      self._mgr = ocp.CheckpointManager(
        self.directory,
        item_names=(STATE, MEMORY, META),
        options=ocp.CheckpointManagerOptions(
          max_to_keep=self.keep,
          create=True,
          cleanup_tmp_directories=True,
          enable_async_checkpointing=self.async_save,
        ),
      )
    return self._mgr

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(
    self, step: int, state: Any, memory_blob: np.ndarray, meta: dict, *, wait: bool = False
  ) -> None:
    """Start saving `step` (async); CheckpointSaveError when it, or the save still in flight,
    fails. A failed step leaves no complete step behind and deletes no older one."""
    self.wait()  # an error of the save in flight surfaces here, before this one starts
    previous = max((s for s in self.steps() if s != step), default=None)
    try:
      self.manager.save(
        step,
        args=ocp.args.Composite(
          **{
            STATE: ocp.args.StandardSave(state),
            MEMORY: ocp.args.StandardSave({"npz": memory_blob}),
            META: ocp.args.JsonSave(meta),
          }
        ),
        force=True,
      )
    except Exception as e:
      self._failed(step, previous, e)
    self._pending = (step, previous)
    if wait:
      self.wait()

  def _failed(self, step: int, previous: Optional[int], error: BaseException):
    self._pending = None
    mgr, self._mgr = self._mgr, None  # reopened from the directory: orbax's step list is off now
    if mgr is not None:
      try:
        mgr.close()
      except Exception:  # noqa: BLE001 - the first error is the one to report
        pass
    _join_orbax_threads(ORBAX_JOIN_S)
    raise CheckpointSaveError(self.directory, step, previous, error) from error

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, np.ndarray, dict]:
    out = self.manager.restore(
      step,
      args=ocp.args.Composite(
        **{
          STATE: ocp.args.StandardRestore(abstract_state),
          MEMORY: ocp.args.StandardRestore(),
          META: ocp.args.JsonRestore(),
        }
      ),
    )
    return out[STATE], np.asarray(out[MEMORY]["npz"], np.uint8), out[META]

  def restore_latest(self, abstract_state: Any, check=None):
    """(step, state, memory blob, meta) of the newest step that restores (and passes `check`),
    or None when there are no steps. Steps that fail are moved aside with a warning."""
    steps = self.steps()
    if not steps:
      return None
    errors = []
    for step in reversed(steps):
      try:
        state, blob, meta = self.restore(step, abstract_state)
        if meta.get("format") != FORMAT_VERSION:
          raise ValueError(f"format {meta.get('format')}, this code reads {FORMAT_VERSION}")
        if check is not None:
          check(state, blob, meta)
        return step, state, blob, meta
      except Exception as e:  # noqa: BLE001 - any failure to read a step means "try the previous"
        path = self.directory / str(step)
        errors.append(f"{path}: {type(e).__name__}: {e}")
        moved = self._quarantine(step)
        log.warning(
          "checkpoint %s cannot be restored (%s: %s); moved it to %s and trying the step before",
          path,
          type(e).__name__,
          str(e)[:300],
          moved,
        )
    raise RuntimeError(
      "no checkpoint under %s could be restored:\n  %s\nmove the directory "
      "away to start from scratch" % (self.directory, "\n  ".join(errors))
    )

  def _quarantine(self, step: int) -> epath.Path:
    src = self.directory / str(step)
    dst = self.directory / f"corrupt-{step}-{int(time.time())}"
    self.close()  # the manager caches its step list; reopen after the move
    src.rename(dst)
    return dst

  def wait(self) -> None:
    """Wait for the save in flight; CheckpointSaveError if it failed."""
    if self._mgr is not None:
      try:
        self._mgr.wait_until_finished()
      except Exception as e:
        step, previous = self._pending or (None, None)
        self._failed(step, previous, e)
    self._pending = None

  def close(self) -> None:
    try:
      self.wait()
    finally:
      if self._mgr is not None:
        self._mgr.close()
        self._mgr = None


ORBAX_JOIN_S = 60.0  # how long a failed save waits for orbax's other threads of that save


def _join_orbax_threads(timeout: float) -> None:
  """Waits (up to `timeout` seconds in all) for orbax's background threads still running, which
  after a failed save are that save's (Checkpointer.save waits for the save before it), e.g. the
  metadata writer that runs after the commits. Otherwise they run on while the
  error ends the program and print a second traceback after its one-line message (the Python
  interpreter refuses their work once it shuts down)."""
  deadline = time.monotonic() + timeout
  for t in threading.enumerate():
    if t is threading.current_thread() or not type(t).__module__.startswith("orbax."):
      continue
    # threading.Thread.join: orbax's own join re-raises the thread's error; this one only waits.
    threading.Thread.join(t, max(0.0, deadline - time.monotonic()))


def describe_error(error: BaseException) -> str:
  """'OSError: [Errno 28] No space left on device: ... (the disk is full)'."""
  why = f"{type(error).__name__}: {error}"
  code = getattr(error, "errno", None)
  if code == errno.ENOSPC or (code is None and "No space left" in str(error)):  # tensorstore
    why += " (the disk is full)"
  elif code == errno.EDQUOT:
    why += " (the disk quota is exhausted)"
  return why


class CheckpointSaveError(RuntimeError):
  """A checkpoint save failed (disk full, quota, permissions, ...). The message says which step,
  why, and which earlier checkpoint a rerun resumes from."""

  def __init__(self, directory, step: Optional[int], previous: Optional[int], error):
    self.step, self.previous, self.error = step, previous, error
    why = describe_error(error)
    what = f"iteration {step} to {directory / str(step)}" if step is not None else str(directory)
    if previous is None:
      after = "There is no earlier checkpoint: rerunning the same command starts from scratch."
    else:
      after = (
        f"The previous checkpoint {directory / str(previous)} (iteration {previous}) is intact; "
        "rerunning the same command resumes from it."
      )
    super().__init__(f"saving the checkpoint of {what} failed: {why}. {after}")


# -- the trainer's state ---------------------------------------------------------------------------
def _flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def saved_train_state(state):
  """What a checkpoint holds of the TrainState: with LoRA the adapters (params) and their optimizer
  state, not the frozen base, which stays where model.checkpoint points (its fingerprint in
  meta["lora_base"], checked on resume and export); the whole state otherwise."""
  adapters, _ = lora.split(state.params)
  return state._replace(params=adapters) if adapters else state


def save_trainer(ckpt: Checkpointer, trainer, *, wait: bool = False) -> int:
  """Checkpoint `trainer` after its last completed iteration; returns the step (= iteration)."""
  step = int(trainer.iteration)
  meta = {
    "format": FORMAT_VERSION,
    "iteration": step,
    "variation_cursor": int(trainer.variation_cursor),
    "config": json.loads(trainer.config.to_json()),
    "saved_at": time.time(),
    "metrics": read_records(trainer.workdir, upto=step),
    "update_floor": dict(getattr(trainer, "update_floor", {})),
  }
  state = {"train": saved_train_state(trainer.state), "rng": trainer.rng}
  if getattr(trainer, "base_fingerprint", None):  # LoRA: the frozen base, by reference
    meta["lora_base"] = trainer.base_fingerprint
  hooks = getattr(trainer, "hooks", None)  # the method plugins' state (methods/base.Hooks)
  if hooks is not None:
    if hooks.state_tree() is not None:
      state["explore"] = hooks.state_tree()
    meta["explore"] = hooks.meta()
  ckpt.save(step, state, memory_to_blob(trainer.memory.store), meta, wait=wait)
  return step


def restore_trainer(ckpt: Checkpointer, trainer, rewrite_metrics: bool = True) -> Optional[int]:
  """Load the newest restorable checkpoint into `trainer`; returns its step or None (none there).

  With `rewrite_metrics`, also rewrites metrics.jsonl to the checkpoint's records, so lines
  written after it (by the run that was killed) are dropped and the resumed iterations are written
  once. Readers that only evaluate (launch/eval.py) pass False."""
  current = {"train": saved_train_state(trainer.state), "rng": trainer.rng}
  hooks = getattr(trainer, "hooks", None)
  if hooks is not None and hooks.state_tree() is not None:
    current["explore"] = hooks.state_tree()
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, current)
  stores = {}

  def check(state, blob, meta):
    del state
    stores["memory"] = memory_from_blob(blob)  # a corrupt blob fails here, not later
    if "variation_cursor" not in meta and "row_cursor" in meta:  # its name in older checkpoints
      meta["variation_cursor"] = meta["row_cursor"]
    for k in ("iteration", "variation_cursor"):
      if not isinstance(meta.get(k), int):
        raise ValueError(f"meta has no integer {k!r}")

  found = ckpt.restore_latest(abstract, check=check)
  if found is None:
    return None
  step, state, _, meta = found
  lora_run, base = lora.split(trainer.state.params)
  if meta.get("lora_base", None) != getattr(trainer, "base_fingerprint", None):
    raise ValueError(
      f"{ckpt.directory / str(step)} holds LoRA adapters trained on a base whose fingerprint is "
      f"{meta.get('lora_base')}, but this run's base (model.checkpoint, model.param_dtype) has "
      f"{getattr(trainer, 'base_fingerprint', None)}: resume with the base the run started from"
    )
  saved = state["train"].params  # LoRA: the adapters, joined to this run's (checked) base
  trainer.state = state["train"]._replace(params=lora.join(saved, base) if lora_run else saved)
  trainer.rng = state["rng"]
  if hooks is not None:
    hooks.load(state.get("explore"), meta.get("explore"))
  trainer.iteration, trainer.variation_cursor = (
    int(meta["iteration"]),
    int(meta["variation_cursor"]),
  )
  if hasattr(trainer, "update_floor"):  # older checkpoints have none: the floor starts at zero
    saved = meta.get("update_floor") or {}
    trainer.update_floor = {k: int(saved.get(k, 0)) for k in trainer.update_floor}
  trainer.memory.replace_store(stores["memory"])
  if rewrite_metrics:
    rewrite_records(trainer.workdir, meta.get("metrics", []))
  now, then = _flatten(json.loads(trainer.config.to_json())), _flatten(meta.get("config", {}))
  then = {config_keys.RENAMED.get(k, k): v for k, v in then.items()}  # an older run's key names
  changed = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
  if changed:
    log.warning(
      "resuming from %s with a different config in %s (checkpoint -> now): %s",
      ckpt.directory / str(step),
      len(changed),
      ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in changed),
    )
  log.info(
    "resumed from %s: iteration %d, variation cursor %d, %d memories",
    ckpt.directory / str(step),
    trainer.iteration,
    trainer.variation_cursor,
    len(trainer.memory.store),
  )
  return step


__all__ = [
  "CHECKPOINT_ASYNC",
  "async_saves",
  "Checkpointer",
  "CheckpointSaveError",
  "save_trainer",
  "restore_trainer",
  "memory_to_blob",
  "memory_from_blob",
  "read_memory",
  "read_records",
  "rewrite_records",
]
