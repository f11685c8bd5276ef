"""Subprocess workers for the multi-process tests: a worker script under tests/helpers runs in a
fresh interpreter (its XLA device count and jax.distributed start happen before jax loads), with a
free localhost port as the coordinator's address."""

import os
import socket
import subprocess
import sys

HELPERS = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def coordinator() -> str:
  return f"localhost:{free_port()}"


def start(worker: str, *args) -> subprocess.Popen:
  """tests/helpers/<worker> with args, stdout and stderr together; XLA_FLAGS is the worker's own."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  return subprocess.Popen(
    [sys.executable, os.path.join(HELPERS, worker), *map(str, args)],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def finish(procs, timeout: float) -> list[str]:
  """Each process's output once it exits; any still running after `timeout` (or after a failure
  here) is killed, so no worker outlives its test. Asserts every exit status is 0."""
  try:
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"worker {i} exited {p.returncode}:\n{log[-4000:]}"
  return logs
