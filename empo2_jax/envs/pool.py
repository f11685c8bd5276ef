"""A pool of worker processes that steps many episodes of any TextEnv at once.

  with EnvPool(SciWorldConfig(), PoolConfig(num_workers=4)) as pool:
    first = pool.reset([("find-plant", 0), ("find-plant", 1), ...])   # one slot per episode
    results = pool.step(["open door to greenhouse", None, ...])       # None: leave slot alone

  EnvPool(registry.get_suite("frozenlake").worker(env_cfg), PoolConfig(...))   # any env

The first argument is a `base.WorkerFactory` (picklable: it is sent to each spawned worker, whose
`start()` makes a WorkerHost that builds the envs of the worker's slots) or, for ScienceWorld, its
SciWorldConfig. Slot i lives on worker i % num_workers; a ScienceWorld worker hosts all its slots
in its one JVM (the host's helper process, `pid`). Each call sends every worker its share first
and then collects, so workers run in parallel.

Failures never reach the caller as exceptions: a worker that errors, dies or stays silent past
`call_timeout_s` is killed (with its JVM, if any) and replaced; its unfinished episodes are reset
and their recorded action texts replayed, then the pending step is sent again. After `max_retries`
failed replacements in one call the worker's unfinished episodes end with `env_failed=True`.
`close()` (also run by the context manager and at interpreter exit) ends every worker and JVM.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import traceback
from typing import Any, Sequence

from empo2_jax.envs.base import (
  DEFAULT_JAVA_OPTIONS,
  ResetInfo,
  ResetResult,
  StepInfo,
  StepResult,
  TextEnv,
  WorkerFactory,
  check_task,
)


@dataclasses.dataclass(frozen=True)
class PoolConfig:
  num_workers: int = 4
  java_tool_options: str = DEFAULT_JAVA_OPTIONS  # ScienceWorld: JAVA_TOOL_OPTIONS of every JVM
  call_timeout_s: float = 120.0  # a worker silent this long on a step call counts as hung
  reset_timeout_s: float = 300.0  # the same for reset/replay calls (loads warm up the JIT)
  start_timeout_s: float = 180.0  # worker start-up, JVM included
  close_timeout_s: float = 15.0
  max_retries: int = 3  # worker replacements per call before episodes are failed

  def __post_init__(self):
    if self.num_workers < 1 or self.max_retries < 0:
      raise ValueError(f"PoolConfig needs num_workers >= 1 and max_retries >= 0, got {self}.")


def usable_cpus() -> int:
  """CPUs this process may run on (its affinity mask on Linux)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def auto_workers(episodes: int, cpus: int | None = None) -> int:
  """The pool size `env.workers=0` picks: one worker per usable CPU (a ScienceWorld step is one
  JVM thread; a worker waits on its JVM), but no more workers than the episodes stepped at once,
  which would only idle."""
  return max(1, min(usable_cpus() if cpus is None else cpus, episodes))


# ---------------------------------------------------------------------------- worker process
def _worker_main(conn, factory: WorkerFactory) -> None:
  """Serves ('reset', [(slot, task, variation, replay_actions)]) and ('step', [(slot, action)])."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
  signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (a preempted trainer finishes its iteration)
  logging.getLogger("py4j").setLevel(logging.CRITICAL)  # a dead JVM is reported to the parent
  try:
    host = factory.start()
  except Exception:  # pylint: disable=broad-except
    conn.send(("error", traceback.format_exc()))
    return
  envs: dict[int, TextEnv] = {}
  try:
    conn.send(("ready", int(host.pid)))
    while True:
      try:
        cmd, payload = conn.recv()
      except EOFError:  # parent gone
        break
      if cmd == "close":
        break
      try:
        if cmd == "reset":
          out = []
          for slot, task, variation, replay in payload:
            env = envs.get(slot) or envs.setdefault(slot, host.new_env())
            first = env.reset(task, variation)
            for action in replay:
              env.step(action)
            out.append(first)
        elif cmd == "step":
          out = [envs[slot].step(action) for slot, action in payload]
        else:
          raise ValueError(f"unknown worker command {cmd!r}")
      except ValueError as e:  # bad input from the caller: report it, keep serving
        conn.send(("bad_input", str(e)))
        continue
      except Exception:  # pylint: disable=broad-except  (JVM/env broken: this worker ends)
        conn.send(("error", traceback.format_exc()))
        break
      conn.send(("ok", out))
  finally:
    with contextlib.suppress(Exception):
      conn.close()
    host.close()


# ---------------------------------------------------------------------------- process helpers
def _proc_start_time(pid: int) -> str | None:
  """Start time of a live, non-zombie process from /proc, or None (guards against pid reuse)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except (FileNotFoundError, ProcessLookupError, IndexError):
    return None
  return None if fields[0] == "Z" else fields[19]


def _kill_if_same(pid: int, start_time: str | None) -> None:
  if pid and start_time is not None and _proc_start_time(pid) == start_time:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)


@dataclasses.dataclass
class _Worker:
  process: Any
  conn: Any
  java_pid: int = 0
  java_start: str | None = None
  dirty: bool = False  # a reply may be pending from an interrupted call
  send_error: str | None = None


@dataclasses.dataclass
class _Episode:
  task: str
  variation: int
  worker: int
  actions: list[str] = dataclasses.field(default_factory=list)
  done: bool = False
  failed: bool = False
  score: float = 0
  steps: int = 0


class _WorkerFailed(Exception):
  pass


# ---------------------------------------------------------------------------- the pool
class EnvPool:
  """Steps many episodes in `num_workers` processes; see the module docstring."""

  def __init__(self, env_config: Any = None, pool_config: PoolConfig | None = None):
    self.config = pool_config or PoolConfig()
    self.factory = worker_factory(env_config, self.config)
    self._ctx = mp.get_context("spawn")
    self._workers: list[_Worker | None] = [None] * self.config.num_workers
    self._episodes: list[_Episode] = []
    self.restarts = 0  # worker replacements so far
    self.java_pids_started: list[int] = []
    self._closed = False
    atexit.register(self.close)
    try:
      handles = [self._spawn() for _ in range(self.config.num_workers)]
      for i, handle in enumerate(handles):
        self._workers[i] = self._await_ready(handle)
    except BaseException:
      self.close()
      raise

  # ----------------------------------------------------------------- public API
  def reset(self, episodes: Sequence[tuple[str, int]]) -> list[ResetResult]:
    """Starts one episode per (task, variation); slot i of later calls is episodes[i]."""
    self._check_open()
    for task, _ in episodes:
      check_task(task, self.factory.tasks)
    n = self.config.num_workers
    self._episodes = [_Episode(task, int(var), i % n) for i, (task, var) in enumerate(episodes)]
    jobs = {w: [] for w in range(n)}
    for slot, ep in enumerate(self._episodes):
      jobs[ep.worker].append((slot, ep.task, ep.variation, []))
    replies = self._run({w: ("reset", items) for w, items in jobs.items() if items})
    out: list[ResetResult | None] = [None] * len(self._episodes)
    for w, items in jobs.items():
      for (slot, *_), result in zip(items, replies.get(w) or [None] * len(items)):
        out[slot] = result if result is not None else self._failed_reset(slot)
    return out

  def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
    """One step for every slot whose action is not None; returns None for the others."""
    self._check_open()
    if len(actions) != len(self._episodes):
      raise ValueError(
        f"step got {len(actions)} actions for {len(self._episodes)} episodes "
        "(pass None for a slot that should not move)."
      )
    out: list[StepResult | None] = [None] * len(actions)
    jobs: dict[int, list] = {}
    for slot, action in enumerate(actions):
      if action is None:
        continue
      ep = self._episodes[slot]
      if ep.failed:
        out[slot] = self._failed_step(slot, action)
      elif ep.done:
        raise ValueError(
          f"Slot {slot} ({ep.task}, variation {ep.variation}) is done; "
          "pass None for it or call reset."
        )
      else:
        jobs.setdefault(ep.worker, []).append((slot, str(action)))
    replies = self._run({w: ("step", items) for w, items in jobs.items()})
    for w, items in jobs.items():
      results = replies.get(w)
      for slot, action in items:
        ep = self._episodes[slot]
        if results is None:  # gave up on this worker
          out[slot] = self._failed_step(slot, action)
          continue
        result = results.pop(0)
        ep.actions.append(action)
        ep.done, ep.score, ep.steps = result.done, result.info.score, result.info.steps
        out[slot] = result
    return out

  def java_pids(self) -> list[int]:
    """Helper process ids (ScienceWorld: JVMs) of the current workers; empty for envs without."""
    return [w.java_pid for w in self._workers if w is not None and w.java_pid]

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    atexit.unregister(self.close)
    for handle in self._workers:
      if handle is not None:
        with contextlib.suppress(Exception):
          handle.conn.send(("close", None))
    for i, handle in enumerate(self._workers):
      if handle is not None:
        handle.process.join(self.config.close_timeout_s)
        self._kill(handle)
        self._workers[i] = None

  def kill(self) -> None:
    """SIGKILL every worker and its JVM now, without waiting (a preemption deadline's last step,
    from another thread: train/run_control.StopSignal)."""
    for handle in list(self._workers):
      if handle is not None:
        with contextlib.suppress(Exception):
          _kill_if_same(handle.java_pid, handle.java_start)
        with contextlib.suppress(Exception):
          handle.process.kill()

  def __enter__(self) -> "EnvPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ----------------------------------------------------------------- calls with recovery
  def _run(self, calls: dict[int, tuple[str, list]]) -> dict[int, list | None]:
    """Sends every worker its call, then collects; a failed worker is recovered (or None)."""
    for w in calls:
      if self._workers[w].dirty:
        try:
          self._replace(w)
        except _WorkerFailed:  # the call fails on the old, dead handle and _recover retries
          pass
    for w, (cmd, items) in calls.items():
      self._send(w, cmd, items)
    replies: dict[int, list | None] = {}
    for w, (cmd, items) in calls.items():
      try:
        replies[w] = self._receive(w, self._timeout(cmd))
      except _WorkerFailed:
        replies[w] = self._recover(w, cmd, items)
    return replies

  def _recover(self, w: int, cmd: str, items: list) -> list | None:
    for _ in range(self.config.max_retries):
      try:
        self._replace(w)
        live = [
          (s, ep)
          for s, ep in enumerate(self._episodes)
          if ep.worker == w and not ep.done and not ep.failed
        ]
        replay = [(s, ep.task, ep.variation, list(ep.actions)) for s, ep in live]
        reset_out: list = []
        if replay:
          self._send(w, "reset", replay)
          reset_out = self._receive(w, self._timeout("reset"))
        if cmd == "reset":
          return reset_out
        self._send(w, cmd, items)
        return self._receive(w, self._timeout(cmd))
      except _WorkerFailed:
        continue
    for ep in self._episodes:
      if ep.worker == w and not ep.done:
        ep.failed = True
    return None

  def _send(self, w: int, cmd: str, items: list) -> None:
    handle = self._workers[w]
    handle.dirty = True
    try:
      handle.conn.send((cmd, items))
    except (OSError, ValueError) as e:  # broken pipe: reported by the matching _receive
      handle.send_error = f"worker {w}: send failed: {e!r}"

  def _timeout(self, cmd: str) -> float:
    return self.config.reset_timeout_s if cmd == "reset" else self.config.call_timeout_s

  def _receive(self, w: int, timeout_s: float) -> list:
    handle = self._workers[w]
    if handle.send_error is not None:
      raise _WorkerFailed(handle.send_error)
    try:
      if not handle.conn.poll(timeout_s):
        raise _WorkerFailed(f"worker {w} silent for {timeout_s} s")
      kind, payload = handle.conn.recv()
    except (EOFError, OSError) as e:
      raise _WorkerFailed(f"worker {w} died: {e!r}") from e
    handle.dirty = False
    if kind == "bad_input":
      raise ValueError(payload)
    if kind != "ok":
      raise _WorkerFailed(f"worker {w} failed:\n{payload}")
    return payload

  # ----------------------------------------------------------------- worker lifecycle
  def _spawn(self) -> _Worker:
    parent, child = self._ctx.Pipe()
    process = self._ctx.Process(
      target=_worker_main,
      args=(child, self.factory),
      daemon=True,
      name=f"{self.factory.name}-worker",
    )
    process.start()
    child.close()
    return _Worker(process=process, conn=parent)

  def _await_ready(self, handle: _Worker) -> _Worker:
    if not handle.conn.poll(self.config.start_timeout_s):
      self._kill(handle)
      raise RuntimeError(
        f"A {self.factory.name} worker did not start within "
        f"{self.config.start_timeout_s} s (PoolConfig.start_timeout_s)."
      )
    kind, payload = handle.conn.recv()
    if kind != "ready":
      self._kill(handle)
      raise RuntimeError(f"A {self.factory.name} worker failed to start:\n{payload}")
    handle.java_pid = payload
    handle.java_start = _proc_start_time(payload) if payload else None
    if payload:
      self.java_pids_started.append(payload)
    return handle

  def _replace(self, w: int) -> None:
    self._kill(self._workers[w])
    self.restarts += 1
    try:
      self._workers[w] = self._await_ready(self._spawn())
    except (RuntimeError, EOFError, OSError) as e:
      raise _WorkerFailed(str(e)) from e

  def _kill(self, handle: _Worker) -> None:
    """Ends a worker and its helper process (JVM) for sure (both SIGKILLed if still running)."""
    if handle.process.is_alive():
      handle.process.kill()
    handle.process.join(5)
    _kill_if_same(handle.java_pid, handle.java_start)
    with contextlib.suppress(Exception):
      handle.conn.close()

  # ----------------------------------------------------------------- failure records
  def _failed_reset(self, slot: int) -> ResetResult:
    ep = self._episodes[slot]
    ep.failed = True
    info = ResetInfo(
      task=ep.task,
      variation=ep.variation,
      task_description="",
      inventory="",
      max_steps=self.factory.max_steps(ep.task),
      env_failed=True,
    )
    return ResetResult("", info)

  def _failed_step(self, slot: int, action: str) -> StepResult:
    ep = self._episodes[slot]
    info = StepInfo(
      score=ep.score,
      valid=False,
      raw_action=action,
      executed_action="",
      moves=0,
      steps=ep.steps,
      truncated=False,
      success=False,
      env_failed=True,
    )
    return StepResult("", 0.0, True, info)

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError("This EnvPool is closed; create a new one.")


def worker_factory(env_config: Any, pool_config: PoolConfig) -> WorkerFactory:
  """The worker factory of `env_config`: a WorkerFactory as it is; a SciWorldConfig (or None,
  ScienceWorld's defaults) becomes ScienceWorld's, with the pool's JVM options."""
  if isinstance(env_config, WorkerFactory):
    return env_config
  from empo2_jax.envs.scienceworld.suite import SciWorldWorkers
  from empo2_jax.envs.scienceworld.env import SciWorldConfig

  if env_config is not None and not isinstance(env_config, SciWorldConfig):
    raise TypeError(
      "EnvPool needs a WorkerFactory (envs/base.py; registry.get_suite(name).worker(env_cfg)) "
      f"or a SciWorldConfig, got {type(env_config).__name__}"
    )
  cfg = env_config or SciWorldConfig()
  return SciWorldWorkers(dataclasses.replace(cfg, java_tool_options=pool_config.java_tool_options))
