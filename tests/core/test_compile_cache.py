"""JAX's persistent compilation cache (empo2_jax/compile_cache.py): where config.train.
compilation_cache points it, that the launch scripts apply it, and that a corrupt entry costs a
compile (in every process, until the cache directory is deleted), not a run."""

import os
import subprocess
import sys
import textwrap

from empo2_jax import compile_cache, defaults

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_resolve(monkeypatch, tmp_path):
  assert defaults.get_config().train.compilation_cache == "auto"
  assert compile_cache.resolve("") is None and compile_cache.resolve("  ") is None
  assert compile_cache.resolve("auto", "gs://b/runs/x/") == "gs://b/runs/jax_compilation_cache"
  assert compile_cache.resolve("auto", "gs://b/runs/x,gs://b/runs/y") == (
    "gs://b/runs/jax_compilation_cache"
  )
  assert compile_cache.resolve("gs://c/cache", "runs/x") == "gs://c/cache"
  assert compile_cache.resolve(str(tmp_path / "c"), "gs://b/x") == str(tmp_path / "c")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
  assert compile_cache.resolve("auto", "runs/x") == str(tmp_path / "env")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  want = str(tmp_path / "xdg" / "empo2_jax" / "jax_compilation_cache")
  assert compile_cache.resolve("auto", "runs/x") == want
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  want = str(tmp_path / "home" / ".cache" / "empo2_jax" / "jax_compilation_cache")
  assert compile_cache.resolve("auto", None) == want


def _python(code, *args, env=None):
  env = dict(os.environ, **(env or {}))
  return subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code), *args],
    capture_output=True,
    text=True,
    cwd=ROOT,
    env=env,
    timeout=300,
  )


# An absl script as the launch scripts are written: cli.run applies the config's cache setting
# after parsing the flags, before main.
SCRIPT = """
  from absl import flags
  from ml_collections import config_flags
  from empo2_jax import cli

  config_flags.DEFINE_config_file("config", None, "config")
  flags.DEFINE_string("workdir", "runs/x", "workdir")

  def main(argv):
    import jax
    print("cache", jax.config.jax_compilation_cache_dir)

  cli.run(main)
"""


def test_launch_scripts_apply_the_config(tmp_path):
  config = "--config=configs/sciworld.py:tiny"
  out = _python(SCRIPT, config, f"--config.train.compilation_cache={tmp_path}/c")
  assert out.returncode == 0, out.stderr
  assert f"cache {tmp_path}/c" in out.stdout
  out = _python(SCRIPT, config, "--config.train.compilation_cache=")
  assert out.returncode == 0, out.stderr
  assert "cache None" in out.stdout
  out = _python(SCRIPT, config, env={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "run")})
  assert f"cache {tmp_path}/run" in out.stdout, out.stderr  # "auto": the test run's cache


# Compiles a program with the cache at argv[1] (every program written: min time 0) and prints its
# value and how many of the process's compiles were read from the cache (JAX's own counters).
COMPILE = """
  import sys
  from empo2_jax import compile_cache
  compile_cache.apply(sys.argv[1])
  import jax
  import jax.numpy as jnp
  from jax._src import monitoring
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  events = []
  monitoring.register_event_listener(lambda name, **kw: events.append(name))
  f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0)
  print("value", float(f(jnp.arange(12.0).reshape(3, 4) / 10)))
  requests = events.count("/jax/compilation_cache/compile_requests_use_cache")
  print("misses", requests - events.count("/jax/compilation_cache/cache_hits"))
"""


def _compile(cache):
  out = _python(COMPILE, str(cache))
  assert out.returncode == 0, out.stderr
  lines = dict(line.split() for line in out.stdout.splitlines())
  return lines["value"], int(lines["misses"]), out.stderr


def test_a_corrupt_cache_entry_is_compiled_again(tmp_path):
  cache = tmp_path / "cache"
  value, misses, _ = _compile(cache)
  entries = sorted(p for p in cache.rglob("*") if p.is_file())
  assert misses > 0 and entries, "the first run writes its programs to the cache"
  assert _compile(cache)[:2] == (value, 0), "the second run reads them back"
  for p in entries:  # garbage: what a killed writer or a bad disk leaves
    p.write_bytes(b"\x28\xb5\x2f\xfd not an executable")
  again, misses_again, stderr = _compile(cache)
  assert (again, misses_again) == (value, misses), "every corrupt entry is compiled again"
  assert "persistent compilation cache" in stderr  # JAX's warning names the entry
  # JAX never overwrites an entry (lru_cache.put skips an existing key): each process compiles
  # these programs again, with the warning, until the directory is deleted.
  assert _compile(cache)[:2] == (value, misses)
