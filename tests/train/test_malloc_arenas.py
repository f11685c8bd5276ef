"""train/hoststats.limit_malloc_arenas against glibc's own count of arenas (malloc_info)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Six threads each malloc while all are alive; glibc's malloc_info lists one <heap> per arena.
PROBE = r"""
import ctypes, os, sys, tempfile, threading
from empo2_jax.train import hoststats
cap = int(sys.argv[1])
print("set", hoststats.limit_malloc_arenas(cap) if cap else False)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
barrier = threading.Barrier(7)
def work():
  p = libc.malloc(1 << 20)
  barrier.wait()
  barrier.wait()
  libc.free(ctypes.c_void_p(p))
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
  t.start()
barrier.wait()
path = os.path.join(tempfile.mkdtemp(), "info.xml")
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
barrier.wait()
for t in threads:
  t.join()
print("heaps", open(path).read().count("<heap nr="))
"""


def _probe(cap, **env):
  out = subprocess.run(
    [sys.executable, "-c", PROBE, str(cap)],
    capture_output=True,
    text=True,
    cwd=ROOT,
    env={k: v for k, v in {**os.environ, **env}.items() if v is not None},
    timeout=120,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
  return lines["set"] == "True", int(lines["heaps"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_cap_limits_the_arenas_glibc_creates():
  _, free = _probe(0, MALLOC_ARENA_MAX=None)
  assert free >= 4  # without a cap, concurrent threads get arenas of their own
  was_set, capped = _probe(2, MALLOC_ARENA_MAX=None)
  assert was_set and capped <= 2
  was_set, _ = _probe(2, MALLOC_ARENA_MAX="4")  # the user's setting wins
  assert not was_set
