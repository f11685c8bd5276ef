"""Chaos soak: train the tiny CPU config while env workers and JVMs die and the trainer is stopped.

    python tests/soak/soak.py                  # make soak; 30 iterations, ~6 min on 2 idle cores
    python tests/soak/soak.py --iterations 8 --bursts 1 --keep

Runs `launch/train.py --config=configs/sciworld.py:tiny` (checkpoint every iteration, one
update shape from the first iteration: optim.update_shapes=max, --update_shapes) as a
subprocess. A monitor thread, polling the trainer's process tree (psutil):
  kills     SIGKILLs a random env worker process or its JVM every few seconds, but only while every
            worker is up with a JVM at least --mature_s old: each such kill is recovered by the
            pool (worker replaced, episodes replayed), so it must cost no episode.
  bursts    --bursts times (spread over the run) kills one worker and then each replacement the
            pool starts for it, max_retries + 1 kills: the pool gives up on that worker's
            unfinished episodes, which must show up as env_failed (1..episodes per worker) in the
            iteration in progress, and nowhere else. One more kill hits the replacement started
            at the slot's next call; the pool must recover from it without losing an episode.
  sigterms  SIGTERMs the trainer --sigterms times early in the run (after its first iteration,
            then right after each resume), so iterations 5..N run in one process; the trainer
            checkpoints and exits 0, and the soak reruns the same command, which resumes.
  memory    rss(i) is the trainer's resident size after iteration i (host/rss_gib in
            metrics.jsonl: measured after gc + malloc_trim, so transient compile and batch
            memory is not counted); the sampled peak while i ran is reported beside it, and the
            XLA compiles after rss_from (host/compiles) say how much of a growth is new shapes.
Every process the trainer starts inherits a tag in its environment, which finds orphans at the end.

Checks: every run exits 0; metrics.jsonl holds iterations 1..N exactly once; no tagged process
is left; rss(N) within --rss_tolerance of rss(5); env_failed as above; at least one kill and
every burst done. Prints `soak iterations= kills= sigterms= orphans= rss_growth= env_failed=` and
exits 1 when a check fails. Not collected by pytest (no test_ prefix); `make soak` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG_VAR = "EMPO2_SOAK_TAG"
NUM_WORKERS = 2  # env.workers (the tiny config's)
ROWS, GROUP = 2, 2  # rollout.variations_per_iter x rollout.group_size = episodes per iteration
EPISODES = ROWS * GROUP


def log(msg: str) -> None:
  print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def read_iterations(workdir: str) -> list[int]:
  """Iterations in metrics.jsonl (a line being written or rewritten is skipped)."""
  try:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      lines = f.read().splitlines()
  except FileNotFoundError:
    return []
  out = []
  for line in lines:
    try:
      out.append(int(json.loads(line)["iteration"]))
    except (ValueError, KeyError, TypeError):
      continue
  return out


def read_records(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _alive(p: psutil.Process) -> bool:
  try:
    return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
  except psutil.Error:
    return False


def _cmdline(p: psutil.Process) -> str:
  try:
    return " ".join(p.cmdline())
  except psutil.Error:
    return ""


class Monitor(threading.Thread):
  """Watches the current trainer: RSS, iterations, kills, bursts and SIGTERMs (module docstring)."""

  def __init__(self, args, workdir: str):
    super().__init__(daemon=True, name="soak-monitor")
    self.args, self.workdir = args, workdir
    self.rng = random.Random(args.seed)
    self.lock = threading.Lock()
    self.proc: subprocess.Popen | None = None
    self.run_index = 0
    self.run_log = ""
    self.run_start_iteration = 0
    self.stop = threading.Event()
    self.kills: list[dict] = []
    self.bursts: list[dict] = []  # done: {"iteration": i, "kills": [...]}
    self.sigterms: list[dict] = []
    self.rss: dict[tuple[int, int], int] = {}  # (pid, latest iteration written) -> peak RSS
    self.rss_end: dict[int, int] = {}  # iteration -> RSS when its metrics line appeared
    self.writer: dict[int, int] = {}  # iteration -> pid of the trainer that wrote it
    self.seen: dict[int, float] = {}  # worker/JVM pid -> create time (all ever seen)
    self.errors: list[str] = []
    self._next_kill = time.time() + args.kill_every
    self._burst_at = [
      max(args.first_burst, round(args.iterations * (k + 1) / (args.bursts + 1)))
      for k in range(args.bursts)
    ]
    self._burst: dict | None = None

  # --------------------------------------------------------------- the trainer
  def attach(self, proc: subprocess.Popen, run_index: int, run_log: str) -> None:
    with self.lock:
      self.proc, self.run_index, self.run_log = proc, run_index, run_log
      self.run_start_iteration = max(read_iterations(self.workdir), default=0)

  def detach(self) -> None:
    with self.lock:
      self.proc = None

  def _tree(self, trainer: psutil.Process):
    """(workers, {worker pid: its live JVM or None}) of the pool: the trainer's children running
    multiprocessing's spawn_main, and their java children."""
    workers, jvms = [], {}
    try:
      children = trainer.children()
    except psutil.Error:
      return [], {}
    for c in children:
      if "spawn_main" not in _cmdline(c):
        continue
      try:
        self.seen.setdefault(c.pid, c.create_time())
      except psutil.Error:
        continue
      if not _alive(c):
        continue
      workers.append(c)
      jvms[c.pid] = None
      try:
        for j in c.children():
          if _alive(j) and "java" in _cmdline(j):
            self.seen.setdefault(j.pid, j.create_time())
            jvms[c.pid] = j
      except psutil.Error:
        pass
    return workers, jvms

  def _kill(self, p: psutil.Process, kind: str, latest: int, burst: bool) -> bool:
    try:
      p.send_signal(signal.SIGKILL)
    except psutil.Error:
      return False
    self.kills.append(
      dict(
        t=time.time(), pid=p.pid, kind=kind, iteration=latest + 1, burst=burst, run=self.run_index
      )
    )
    log(f"kill {kind} {p.pid} (iteration {latest + 1}{', burst' if burst else ''})")
    return True

  def run(self) -> None:
    while not self.stop.is_set():
      try:
        self._poll()
      except Exception as e:  # pylint: disable=broad-except
        self.errors.append(f"monitor: {e!r}")
        log(f"monitor error: {e!r}")
      time.sleep(self.args.poll_s)

  def _poll(self) -> None:
    with self.lock:
      proc, run_index = self.proc, self.run_index
    if proc is None or proc.poll() is not None:
      return
    try:
      trainer = psutil.Process(proc.pid)
      rss = trainer.memory_info().rss
    except psutil.Error:
      return
    iterations = read_iterations(self.workdir)
    latest = max(iterations, default=0)
    if latest > self.run_start_iteration and latest not in self.writer:
      for i in range(self.run_start_iteration + 1, latest + 1):
        self.writer.setdefault(i, proc.pid)
      self.rss_end[latest] = rss
    key = (proc.pid, latest)
    self.rss[key] = max(self.rss.get(key, 0), rss)
    self._maybe_sigterm(proc, run_index, latest)
    workers, jvms = self._tree(trainer)
    if self._burst is not None:
      self._step_burst(workers, jvms, latest)
      return
    healthy = (
      len(workers) == NUM_WORKERS
      and all(j is not None for j in jvms.values())
      and all(time.time() - self.seen[j.pid] >= self.args.mature_s for j in jvms.values())
    )
    if not healthy or latest >= self.args.iterations:
      return
    if (
      self._burst_at
      and latest + 1 >= self._burst_at[0]
      and len(self.sigterms) >= self.args.sigterms
    ):
      self._burst_at.pop(0)
      w = self.rng.choice(workers)
      target, kind = (w, "worker") if self.rng.random() < 0.5 else (jvms[w.pid], "jvm")
      self._burst = dict(kills=[], known={x.pid for x in workers}, started=time.time())
      if self._kill(target, kind, latest, burst=True):
        self._burst["kills"].append(target.pid)
      return
    if time.time() >= self._next_kill:
      w = self.rng.choice(workers)
      target, kind = (w, "worker") if self.rng.random() < 0.5 else (jvms[w.pid], "jvm")
      self._kill(target, kind, latest, burst=False)
      self._next_kill = time.time() + self.args.kill_every * self.rng.uniform(0.5, 1.5)

  def _step_burst(self, workers, jvms, latest: int) -> None:
    """Kill every new worker the pool starts for the slot: max_retries + 1 kills make the pool
    give up in the call then in progress; one more kills the replacement the pool starts at the
    slot's next call (the worker keeps dying), which the pool must recover from."""
    b = self._burst
    if len(b["kills"]) == self.args.max_retries + 1 and "iteration" not in b:
      b["iteration"] = self.kills[-1]["iteration"]  # the call that gave up was in progress
    if len(b["kills"]) >= self.args.max_retries + 2:
      self.bursts.append(dict(iteration=b["iteration"], kills=list(b["kills"])))
      log(f"burst done: gave up in iteration {b['iteration']}, {len(b['kills'])} kills")
      self._burst = None
      self._next_kill = time.time() + self.args.kill_every
      return
    if time.time() - b["started"] > self.args.burst_timeout_s:
      self.errors.append(f"burst stalled after {len(b['kills'])} kills")
      self._burst = None
      return
    for w in workers:
      if w.pid not in b["known"]:
        b["known"].add(w.pid)
        if self._kill(w, "worker", latest, burst=True):
          b["kills"].append(w.pid)
        return

  def _maybe_sigterm(self, proc: subprocess.Popen, run_index: int, latest: int) -> None:
    """SIGTERM k goes to run k once its handler is surely installed: after its first new
    iteration (a fresh start) or once it printed that it resumed."""
    if len(self.sigterms) >= self.args.sigterms or any(
      s["run"] == run_index for s in self.sigterms
    ):
      return
    if run_index == 0:
      ready = latest > self.run_start_iteration
    else:
      try:
        with open(self.run_log, encoding="utf-8", errors="replace") as f:
          ready = "resumed from" in f.read()
      except FileNotFoundError:
        ready = False
    if ready:
      proc.send_signal(signal.SIGTERM)
      self.sigterms.append(dict(t=time.time(), run=run_index, pid=proc.pid, iteration=latest + 1))
      log(f"SIGTERM trainer {proc.pid} (run {run_index}, iteration {latest + 1})")

  # --------------------------------------------------------------- results
  def rss_at(self, iteration: int) -> tuple[int | None, int | None]:
    """(pid, peak RSS while `iteration` ran in the process that wrote it)."""
    pid = self.writer.get(iteration)
    return pid, self.rss.get((pid, iteration - 1))


def tagged_processes(tag: str) -> list[psutil.Process]:
  out = []
  for p in psutil.process_iter(["pid"]):
    try:
      if p.environ().get(TAG_VAR) == tag and _alive(p):
        out.append(p)
    except psutil.Error:
      continue
  return out


def command(args, workdir: str) -> list[str]:
  return [
    sys.executable,
    os.path.join(ROOT, "launch", "train.py"),
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py") + ":tiny",
    f"--workdir={workdir}",
    f"--config.train.iterations={args.iterations}",
    "--config.train.checkpoint_every=1",
    "--config.train.keep_checkpoints=2",
    f"--config.env.max_retries={args.max_retries}",
    f"--config.env.workers={NUM_WORKERS}",
    f"--config.rollout.variations_per_iter={ROWS}",
    f"--config.rollout.group_size={GROUP}",
    f"--config.optim.update_shapes={args.update_shapes}",
    "--no_progress",
  ]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--iterations", type=int, default=30)
  p.add_argument("--sigterms", type=int, default=2)
  p.add_argument("--bursts", type=int, default=2, help="kill chains that exhaust max_retries")
  p.add_argument("--first_burst", type=int, default=8, help="no burst before this iteration")
  p.add_argument("--max_retries", type=int, default=3, help="config.env.max_retries")
  p.add_argument("--kill_every", type=float, default=5.0, help="seconds between random kills")
  p.add_argument("--mature_s", type=float, default=8.0, help="JVM age before it may be killed")
  p.add_argument("--poll_s", type=float, default=0.1)
  p.add_argument("--burst_timeout_s", type=float, default=600.0)
  p.add_argument("--rss_from", type=int, default=5, help="rss_growth = rss(last) / rss(this) - 1")
  p.add_argument("--rss_tolerance", type=float, default=0.10)
  p.add_argument(
    "--update_shapes",
    default="max",
    choices=("max", "grow", "fit"),
    help="config.optim.update_shapes: max (a long unattended run's setting: one update program "
    "from iteration 1), grow (the default: a compile when a larger batch first shows up)",
  )
  p.add_argument("--timeout_s", type=float, default=5400.0, help="for the whole soak")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--workdir", default=None, help="default: a new temporary directory")
  p.add_argument("--keep", action="store_true", help="keep the workdir (kept anyway on failure)")
  args = p.parse_args(argv)
  if args.iterations <= args.rss_from:
    p.error("--iterations must exceed --rss_from")

  workdir = args.workdir or tempfile.mkdtemp(prefix="empo2_soak_")
  os.makedirs(workdir, exist_ok=True)
  tag = uuid.uuid4().hex
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    TOKENIZERS_PARALLELISM="false",
    JAX_COMPILATION_CACHE_DIR=os.path.join(workdir, "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    **{TAG_VAR: tag},
  )
  log(f"workdir {workdir}")
  monitor = Monitor(args, workdir)
  monitor.start()
  failures: list[str] = []
  deadline = time.time() + args.timeout_s
  exits = []
  for run_index in range(args.sigterms + 1):
    run_log = os.path.join(workdir, f"run{run_index}.log")
    with open(run_log, "w") as f:
      proc = subprocess.Popen(
        command(args, workdir), stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT
      )
      monitor.attach(proc, run_index, run_log)
      log(f"run {run_index}: trainer {proc.pid}")
      try:
        rc = proc.wait(timeout=max(1.0, deadline - time.time()))
      except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        failures.append(f"run {run_index} timed out (--timeout_s={args.timeout_s})")
      monitor.detach()
    exits.append(rc)
    with open(run_log, encoding="utf-8", errors="replace") as f:
      tail = f.read()[-3000:]
    log(f"run {run_index}: exit {rc}")
    if rc != 0:
      failures.append(f"run {run_index} exited {rc}; log tail:\n{tail}")
      break
    if "preempted (SIGTERM)" not in tail:
      break  # finished
  monitor.stop.set()
  monitor.join(5)

  # Orphans: tagged processes still there once the last trainer is gone (JVMs exit within
  # seconds of their worker).
  orphans = tagged_processes(tag)
  t_end = time.time() + 30
  while orphans and time.time() < t_end:
    time.sleep(1)
    orphans = tagged_processes(tag)
  for o in orphans:
    failures.append(f"orphan process {o.pid}: {_cmdline(o)[:160]}")
    try:
      o.kill()
    except psutil.Error:
      pass

  iterations = read_iterations(workdir)
  want = list(range(1, args.iterations + 1))
  if sorted(iterations) != want:
    failures.append(f"metrics.jsonl iterations {iterations}, want 1..{args.iterations} once each")
  if len(monitor.sigterms) != args.sigterms or len(exits) != args.sigterms + 1:
    failures.append(f"{len(monitor.sigterms)} SIGTERMs sent, {len(exits)} runs")

  # Memory: both points in one process (the SIGTERMs come before iteration rss_from).
  records = {}
  try:
    records = {int(r["iteration"]): r for r in read_records(workdir)}
  except (OSError, ValueError) as e:
    failures.append(f"metrics.jsonl unreadable: {e!r}")
  pid_a, peak_a = monitor.rss_at(args.rss_from)
  pid_b, peak_b = monitor.rss_at(args.iterations)
  rss_a = records.get(args.rss_from, {}).get("host/rss_gib")
  rss_b = records.get(args.iterations, {}).get("host/rss_gib")
  late_compiles = sum(
    int(records.get(i, {}).get("host/compiles", 0))
    for i in range(args.rss_from + 1, args.iterations + 1)
  )
  growth = peak_growth = None
  if peak_a and peak_b:
    peak_growth = peak_b / peak_a - 1
  if rss_a and rss_b:
    growth = rss_b / rss_a - 1
    if abs(growth) > args.rss_tolerance:
      failures.append(
        f"trainer RSS {rss_a * 1024:.0f} MiB after iteration {args.rss_from} -> "
        f"{rss_b * 1024:.0f} MiB after {args.iterations} ({growth:+.1%}; "
        f"{late_compiles} XLA compiles in between)"
      )
    if pid_a != pid_b:
      log(f"note: RSS points from two processes ({pid_a}, {pid_b})")
  else:
    failures.append(
      f"no host/rss_gib in metrics.jsonl for iteration {args.rss_from} or {args.iterations}"
    )

  with open(os.path.join(workdir, "rss.jsonl"), "w") as f:
    for it in want:
      pid, peak = monitor.rss_at(it)
      rec = records.get(it, {})
      row = dict(iteration=it, pid=pid, peak=peak, end=monitor.rss_end.get(it))
      row.update(rss_gib=rec.get("host/rss_gib"), compiles=rec.get("host/compiles"))
      f.write(json.dumps(row) + "\n")

  # env_failed: only in the iterations of completed bursts, 1..episodes per worker each.
  failed = {}
  try:
    failed = {int(r["iteration"]): int(r.get("env_failed", 0)) for r in read_records(workdir)}
  except (OSError, ValueError) as e:
    failures.append(f"metrics.jsonl unreadable: {e!r}")
  per_worker = EPISODES // NUM_WORKERS
  bursts_in = {}
  for b in monitor.bursts:
    bursts_in[b["iteration"]] = bursts_in.get(b["iteration"], 0) + 1
  for it, n in sorted(failed.items()):
    lo, hi = bursts_in.get(it, 0), bursts_in.get(it, 0) * per_worker
    if not lo <= n <= hi:
      failures.append(f"iteration {it}: env_failed={n}, expected {lo}..{hi} (bursts {lo})")
  total_failed = sum(failed.values())
  expected = f"{sum(bursts_in.values())}..{sum(bursts_in.values()) * per_worker}"
  if len(monitor.bursts) != args.bursts:
    failures.append(f"{len(monitor.bursts)} of {args.bursts} bursts done")
  if not any(not k["burst"] for k in monitor.kills):
    failures.append("no random kill happened")
  failures += monitor.errors

  for f in failures:
    log(f"FAIL {f}")
  kinds = {}
  for k in monitor.kills:
    kinds[k["kind"]] = kinds.get(k["kind"], 0) + 1
  mib = {i: f"{r * 1024:.0f}" if r else "n/a" for i, r in ((args.rss_from, rss_a), (-1, rss_b))}
  every = max(1, args.iterations // 10)
  trace = " ".join(
    f"{i}:{monitor.rss_at(i)[1] // 2**20}"
    for i in range(every, args.iterations + 1, every)
    if monitor.rss_at(i)[1]
  )
  log(f"trainer peak RSS MiB by iteration (rss.jsonl has all): {trace}")
  trimmed = " ".join(
    f"{i}:{records[i]['host/rss_gib'] * 1024:.0f}/{records[i].get('host/compiles', 0)}"
    for i in range(1, args.iterations + 1)
    if "host/rss_gib" in records.get(i, {})
  )
  log(f"trainer RSS MiB after each iteration / XLA compiles in it: {trimmed}")
  log(
    f"kills by kind {kinds}; bursts in iterations {[b['iteration'] for b in monitor.bursts]}; "
    f"trainer RSS MiB: iteration {args.rss_from} {mib[args.rss_from]} (pid {pid_a}), "
    f"iteration {args.iterations} {mib[-1]} (pid {pid_b}); runs exit {exits}"
  )
  growth_s = f"{growth:+.1%}" if growth is not None else "n/a"
  peak_s = f"{peak_growth:+.1%}" if peak_growth is not None else "n/a"
  print(
    f"soak iterations={len(set(iterations))} kills={len(monitor.kills)} "
    f"sigterms={len(monitor.sigterms)} orphans={len(orphans)} rss_growth={growth_s} "
    f"peak_rss_growth={peak_s} compiles_after_{args.rss_from}={late_compiles} "
    f"env_failed={total_failed} (expected {expected})",
    flush=True,
  )
  if failures or args.keep:
    log(f"workdir kept: {workdir}")
  elif not args.workdir:
    shutil.rmtree(workdir, ignore_errors=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
