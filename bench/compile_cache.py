"""Time to the first iteration with and without JAX's persistent compilation cache
(train.compilation_cache, empo2_jax/compile_cache.py): a resumed training run and
`launch/eval.py` after training, each started twice without the cache and twice with it.

  .venv/bin/python bench/compile_cache.py [--config configs/sciworld.py:cpu] [--runs 2]

Set-up (untimed): one `launch/train.py` iteration in a scratch workdir, evaluations off, with the
cache on in a fresh directory: it leaves a checkpoint and a cache holding the programs a training
process compiles. Then each timed run starts a new process from a copy of that workdir:
  resume  `launch/train.py --config.train.iterations=2`: it restores the checkpoint and runs one
          iteration; timed from the start of the process until iteration 2's line is in
          metrics.jsonl (restore, model and env start, the compiles, one rollout and update)
  eval    `launch/eval.py` on the checkpoint; timed until the process exits
`--config.train.compilation_cache=` (off) or the set-up's directory (on). The cache's first
readers also add the programs set-up did not compile (eval's), so the second "on" run is the
steady state. Lines: `compile_cache phase=<resume|eval> cache=<off|on> run=<i> s=<seconds>`, then
`compile_cache resume_s off=<mean> on=<mean> ratio=<off/on> eval_s off=<mean> on=<mean>
ratio=<off/on>`.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import REPO, parser


def _launch(script, config, workdir, cache, *extra):
  cmd = [
    sys.executable,
    os.path.join(REPO, "launch", script),
    f"--config={config}",
    f"--workdir={workdir}",
    f"--config.train.compilation_cache={cache}",
    "--config.train.eval_every=0",
    "--config.train.eval_at_end=False",
    *extra,
  ]
  if script == "train.py":
    cmd.append("--no_progress")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  log = open(os.path.join(os.path.dirname(workdir), os.path.basename(workdir) + ".log"), "w")
  return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO), log


def _iterations(workdir) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  return sum(1 for line in open(path) if line.strip())


def _finish(proc, log, what):
  rc = proc.wait()
  log.close()
  if rc != 0:
    sys.exit(f"error: {what} exited {rc}; see {log.name}")


def _resume_s(config, base, workdir, cache) -> float:
  shutil.copytree(base, workdir)
  t0 = time.time()
  proc, log = _launch("train.py", config, workdir, cache, "--config.train.iterations=2")
  while _iterations(workdir) < 2:
    if proc.poll() is not None:
      sys.exit(f"error: the resumed run exited {proc.returncode}; see {log.name}")
    time.sleep(0.2)
  seconds = time.time() - t0
  _finish(proc, log, "the resumed run")
  return seconds


def _eval_s(config, base, workdir, cache) -> float:
  shutil.copytree(base, workdir)
  t0 = time.time()
  proc, log = _launch("eval.py", config, workdir, cache)
  _finish(proc, log, "eval")
  return time.time() - t0


def main():
  ap = parser(__doc__)
  ap.add_argument("--config", default="configs/sciworld.py:cpu")
  ap.add_argument("--runs", type=int, default=2, help="timed runs per phase and setting")
  args = ap.parse_args()
  scratch = tempfile.mkdtemp(prefix="bench_compile_cache_")
  try:
    cache, base = os.path.join(scratch, "cache"), os.path.join(scratch, "base")
    proc, log = _launch("train.py", args.config, base, cache, "--config.train.iterations=1")
    _finish(proc, log, "set-up training")
    means = {}
    for phase, timed in (("resume", _resume_s), ("eval", _eval_s)):
      for setting, directory in (("off", ""), ("on", cache)):
        times = []
        for i in range(args.runs):
          workdir = os.path.join(scratch, f"{phase}_{setting}_{i}")
          times.append(timed(args.config, base, workdir, directory))
          line = f"compile_cache phase={phase} cache={setting} run={i} s={times[-1]:.1f}"
          print(line, flush=True)
        means[phase, setting] = sum(times) / len(times)
    print(
      " ".join(
        ["compile_cache"]
        + [
          f"{phase}_s off={means[phase, 'off']:.1f} on={means[phase, 'on']:.1f} "
          f"ratio={means[phase, 'off'] / means[phase, 'on']:.2f}"
          for phase in ("resume", "eval")
        ]
      )
    )
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
  main()
