"""One run per workdir: a lock file `<workdir>/.lock` naming the process that holds it.

    lock = WorkdirLock(workdir).acquire()   # WorkdirBusy (naming pid, host, start) when held
    try: ... finally: lock.release()        # or: with WorkdirLock(workdir): ...

The file is JSON: pid, host, start time, the command line, a random token (release removes only
our own lock), the boot id and the process's start tick (a pid reused after a reboot or by another
process does not look alive), and a heartbeat time that a background thread refreshes every
`heartbeat_s` seconds.

A lock left behind by a run that died without releasing it (SIGKILL, a crash, a power cut) is
stale and taken over with a warning naming it:
  same host     the pid is gone, belongs to another process now, or the machine rebooted since;
  other host    the heartbeat is older than `stale_after_s` (we cannot look at its processes).

Local workdirs create the file atomically (O_CREAT | O_EXCL; also on NFS v3+). Object stores
(gs://, through etils.epath) have no exclusive create here: the lock is written when absent, then
read back after `settle_s` seconds and kept only if it is still ours. This is best-effort: two
runs starting within the same moment on a gs:// workdir can both get past it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Optional

from etils import epath

log = logging.getLogger("empo2_jax")
LOCK_NAME = ".lock"


class WorkdirBusy(RuntimeError):
  """Another run holds the workdir's lock."""


def _is_local(path) -> bool:
  return "://" not in str(path)


def _boot_id() -> str:
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:
    return ""


def _pid_start(pid: int) -> str:
  """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); '' if none."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return ""
  return stat.rsplit(")", 1)[-1].split()[19]


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process
    return True
  return True


def _when(t: float) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


class WorkdirLock:
  def __init__(
    self,
    workdir,
    *,
    heartbeat_s: float = 60.0,
    stale_after_s: float = 600.0,
    settle_s: float = 1.0,
    local: Optional[bool] = None,
  ):
    self.workdir = epath.Path(workdir)
    self.path = self.workdir / LOCK_NAME
    self.heartbeat_s, self.stale_after_s, self.settle_s = heartbeat_s, stale_after_s, settle_s
    # local=False forces the object-store protocol (tests run it on a local directory).
    self.local = _is_local(workdir) if local is None else local
    self.held = False
    self.lost = False  # the heartbeat found someone else's lock in our place
    self._info: dict = {}
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  # -- content --------------------------------------------------------------------------------
  def _new_info(self) -> dict:
    now, pid = time.time(), os.getpid()
    return {
      "pid": pid,
      "host": socket.gethostname(),
      "started": _when(now),
      "started_unix": now,
      "heartbeat_unix": now,
      "command": " ".join(sys.argv),
      "token": uuid.uuid4().hex,
      "boot_id": _boot_id(),
      "pid_start": _pid_start(pid),
    }

  def _read(self) -> Optional[dict]:
    """The lock's content; None when there is no lock; {} when it cannot be parsed."""
    for attempt in range(5):  # a lock being written right now reads empty for a moment
      try:
        text = self.path.read_text()
      except FileNotFoundError:
        return None
      try:
        info = json.loads(text)
        if isinstance(info, dict) and "pid" in info:
          return info
      except json.JSONDecodeError:
        pass
      time.sleep(0.1 * (attempt + 1))
    return {}

  def _stale_reason(self, info: dict) -> Optional[str]:
    """Why the lock described by `info` is stale, or None while its holder may be alive."""
    now = time.time()
    if not info:  # unreadable: stale once nobody could still be writing it
      try:
        age = now - self.path.stat().mtime
      except (OSError, AttributeError):
        return None
      return f"it is unreadable and {age:.0f} s old" if age > self.stale_after_s else None
    if info.get("host") == socket.gethostname():
      pid = int(info["pid"])
      if info.get("boot_id") and _boot_id() and info["boot_id"] != _boot_id():
        return "the machine has rebooted since"
      if not _pid_alive(pid):
        return f"process {pid} no longer exists"
      if info.get("pid_start") and _pid_start(pid) and info["pid_start"] != _pid_start(pid):
        return f"pid {pid} now belongs to another process"
      return None
    age = now - float(info.get("heartbeat_unix", 0.0))
    if age > self.stale_after_s:
      return (
        f"its heartbeat is {age:.0f} s old (another host; stale after {self.stale_after_s:g} s)"
      )
    return None

  def _busy_message(self, info: dict) -> str:
    if not info:
      return (
        f"workdir {self.workdir} is in use: its lock file {self.path} exists but cannot be read. "
        "If no run uses this workdir, delete the lock file."
      )
    age = max(0.0, time.time() - float(info.get("started_unix", time.time())))
    return (
      f"workdir {self.workdir} is in use by another run: pid {info['pid']} on host "
      f"{info.get('host')}, started {info.get('started')} ({age:.0f} s ago), command: "
      f"{info.get('command', '?')}. Stop that run or pick another workdir; if that process is "
      f"gone, delete the lock file {self.path}."
    )

  # -- acquire / release ----------------------------------------------------------------------
  def _create(self, info: dict) -> bool:
    """Write the lock if there is none; True when it is ours."""
    text = json.dumps(info)
    if self.local:
      try:
        fd = os.open(os.fspath(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
      return True
    if self.path.exists():
      return False
    self.path.write_text(text)
    time.sleep(self.settle_s)  # a run that wrote at the same moment overwrote it by now
    now = self._read()
    return bool(now) and now.get("token") == info["token"]

  def _take_over(self, stale: dict, reason: str) -> None:
    """Move a stale lock out of the way (only the one we judged: a fresh one is put back)."""
    aside = self.path.parent / f"{LOCK_NAME}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
      self.path.rename(aside)
    except FileNotFoundError:  # someone else moved it first
      return
    moved = {}
    try:
      moved = json.loads(aside.read_text())
    except (OSError, json.JSONDecodeError):
      pass
    if stale and moved.get("token") != stale.get("token"):  # a new lock came in between
      if self.local:
        try:
          os.link(os.fspath(aside), os.fspath(self.path))
        except FileExistsError:
          pass
      elif not self.path.exists():
        aside.rename(self.path)
    else:
      log.warning(
        "taking over the stale lock %s of pid %s on host %s (started %s): %s",
        self.path,
        stale.get("pid", "?"),
        stale.get("host", "?"),
        stale.get("started", "?"),
        reason,
      )
    try:
      aside.unlink()
    except FileNotFoundError:
      pass

  def acquire(self) -> "WorkdirLock":
    """Take the lock, or raise WorkdirBusy naming the process that holds it."""
    if self.held:
      return self
    self.workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
      info = self._new_info()
      if self._create(info):
        self._info, self.held = info, True
        self._start_heartbeat()
        return self
      current = self._read()
      if current is None:  # released in between: try again
        continue
      reason = self._stale_reason(current)
      if reason is None:
        raise WorkdirBusy(self._busy_message(current))
      self._take_over(current, reason)
    raise WorkdirBusy(f"could not take the lock {self.path}: other runs keep taking it")

  def release(self) -> None:
    if not self.held:
      return
    self.held = False
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
      self._thread = None
    current = self._read()
    if current and current.get("token") == self._info["token"]:
      try:
        self.path.unlink()
      except FileNotFoundError:
        pass
    elif current is not None:
      log.warning("not removing %s: it is not our lock any more (%s)", self.path, current)

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()

  # -- heartbeat ------------------------------------------------------------------------------
  def _start_heartbeat(self) -> None:
    if self.heartbeat_s <= 0:
      return
    self._stop.clear()
    self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        current = self._read()
        if not current or current.get("token") != self._info["token"]:
          self.lost = True
          log.error(
            "the lock %s was taken by another run (%s); two runs may now write this workdir",
            self.path,
            current,
          )
          return
        info = dict(self._info, heartbeat_unix=time.time())
        if self.local:  # replace atomically: readers never see a half-written lock
          tmp = self.path.parent / f"{LOCK_NAME}.beat-{os.getpid()}"
          tmp.write_text(json.dumps(info))
          tmp.replace(self.path)
        else:
          self.path.write_text(json.dumps(info))
        self._info = info
      except Exception as e:  # noqa: BLE001 - a missed heartbeat must not stop training
        log.warning("could not refresh the lock %s: %s", self.path, e)


__all__ = ["WorkdirLock", "WorkdirBusy", "LOCK_NAME"]
