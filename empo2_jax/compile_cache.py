"""JAX's persistent compilation cache, set from config.train.compilation_cache.

    compile_cache.apply(config.train.compilation_cache, workdir)   # before the first compile
    compile_cache.resolve("auto", "gs://b/runs/x")                  # -> "gs://b/runs/jax_compilation_cache"

A compiled XLA program is written to the cache directory and read back by the next process that
compiles the same program (same HLO, jax/jaxlib version, backend and flags), so a rerun after a
preemption, `launch/eval.py` after training and every test process skip the compiles already paid
for. cli.run applies it for every absl launch script once the flags are parsed; launch/aot.py
applies it itself.

The setting:
  "auto"  beside a gs:// workdir (<workdir>/../jax_compilation_cache: one cache a pod's hosts and
          the runs of one bucket folder share); otherwise $JAX_COMPILATION_CACHE_DIR when set
          (tests/conftest.py sets one per test run), else
          <user cache>/empo2_jax/jax_compilation_cache
          (<user cache>: $XDG_CACHE_HOME, or ~/.cache).
  ""      off.
  a path  that directory (local or gs://).

Only programs that took at least MIN_COMPILE_SECS to compile are written (JAX's own default):
small programs compile faster than the cache reads them back. A stale entry (another
jax/jaxlib, other flags, another program) has another key and is never read. An entry that cannot
be read or deserialized (a corrupt file) makes JAX warn ("Error reading persistent compilation
cache entry") and compile again; JAX never overwrites an entry, so every later process compiles
that program again, with the warning, until the directory is deleted
(tests/core/test_compile_cache.py). The directory grows without bound: delete it to reclaim the
space; nothing else is lost.
"""

from __future__ import annotations

import os
import posixpath
import sys
from typing import Optional

from empo2_jax import remote

DIRNAME = "jax_compilation_cache"
MIN_COMPILE_SECS = 1.0  # jax_persistent_cache_min_compile_time_secs


def user_cache_dir() -> str:
  """<$XDG_CACHE_HOME or ~/.cache>/empo2_jax/jax_compilation_cache."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "empo2_jax", DIRNAME)


def resolve(setting: str, workdir: Optional[str] = None) -> Optional[str]:
  """The cache directory `setting` names (see the module docstring); None when off."""
  setting = str(setting).strip()
  if not setting:
    return None
  if setting != "auto":
    return setting if remote.is_remote(setting) else os.path.abspath(os.path.expanduser(setting))
  workdir = str(workdir or "").split(",")[0].rstrip("/")
  if remote.is_remote(workdir):
    return posixpath.join(posixpath.dirname(workdir), DIRNAME)
  return os.environ.get("JAX_COMPILATION_CACHE_DIR") or user_cache_dir()


def apply(setting: str, workdir: Optional[str] = None) -> Optional[str]:
  """Point JAX's persistent cache at resolve(setting, workdir), or turn it off; returns the
  directory. Call before the first compile: JAX opens the cache once, at its first compile."""
  path = resolve(setting, workdir)
  if path is not None and remote.is_remote(path):
    remote.check(path)  # gs:// needs gcsfs: a one-line error now, not a warning per compile
  if "jax" not in sys.modules:  # JAX reads these at import: nothing is imported before it must be
    if path is None:
      os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
      os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(MIN_COMPILE_SECS)
    return path
  import jax

  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
  return path
