"""Expand a sweep (configs/sweeps.py) into runs of launch/train.py, each with its own workdir.

  python launch/sweep.py --config=configs/sciworld.py:cpu --sweep=configs/sweeps.py:pq \
      --workdir=runs/pq --print_commands        # one command per run (a cluster's job list)
  python launch/sweep.py --config=... --sweep=configs/sweeps.py:methods --workdir=runs/m
                                                # run them one after another, here
  python launch/sweep.py ... --dry_run          # the expanded runs as JSON, nothing started

Arguments this script does not know (e.g. --config.train.iterations=20, --no_progress) are passed
to every run. Rerunning a sweep resumes each run from its newest checkpoint (launch/train.py).
A sweep file is any Python file with `get_sweep(name) -> list[dict]` (configs/sweeps.py) or a
`SWEEPS = {name: [run, ...]}` dict, so `--sweep=my_sweeps.py:mine` runs a sweep kept outside the
repository; `--import=MODULE_OR_FILE` (repeatable) imports a method's module first and is passed
to every run. <workdir>/sweep.json lists the runs; `python launch/plot.py --workdirs=<workdir>`
compares them.
The workdir may be gs://BUCKET/DIR (needs gcsfs): sweep.json and every run's workdir go there, as
launch/train.py writes a gs:// workdir.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from etils import epath

from empo2_jax.defaults import load_module
from empo2_jax import cli, config_keys, preflight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "launch", "train.py")


def script_for(method) -> str:
  """The entry point of a run: launch/train.py, or the script of a method that has its own
  (empo2_jax/methods/: SPA runs launch/spa.py)."""
  if not method:
    return TRAIN
  from empo2_jax import methods

  (first, *_) = cli.command_lines(methods.get(method), "CONFIG", "WORKDIR")
  for part in first.split():
    if part.startswith("launch/") and part.endswith(".py"):
      return os.path.join(ROOT, part)
  return TRAIN


def _split(arg: str) -> tuple[str, str | None]:
  path, _, rest = arg.partition(":")
  return path, (rest if rest else None)


def _fmt(v) -> str:
  return f"{v:.3g}" if isinstance(v, float) else str(v)


def run_name(overrides: dict) -> str:
  if "name" in overrides:
    return str(overrides["name"])
  parts = [f"{k.split('.')[-1]}={_fmt(v)}" for k, v in overrides.items()]
  return ",".join(parts) or "base"


def check_overrides(config, overrides: dict, where: str) -> None:
  """Fail early, naming the valid keys, when a sweep sets a field the config lacks or mistypes."""
  config = config.copy_and_resolve_references()
  config.unlock()  # only to test the assignment; the train run gets a locked config
  for key, value in overrides.items():
    if key == "name":
      continue
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
      keys = list(node.keys()) if hasattr(node, "keys") else []
      if part not in keys and key in config_keys.RENAMED:
        raise SystemExit(
          f"error: sweep {where} sets {key!r}: renamed, set {config_keys.RENAMED[key]!r}"
        )
      if part not in keys:
        raise SystemExit(
          f"error: sweep {where} sets {key!r}: config.{'.'.join(parts[:i]) or ''} "
          f"has no field {part!r}; valid keys: {', '.join(sorted(keys))}"
        )
      if i < len(parts) - 1:
        node = node[part]
    try:
      setattr(node, parts[-1], value)
    except (TypeError, ValueError) as e:
      raise SystemExit(f"error: sweep {where} sets {key}={value!r}: {e}") from e


def load_sweep(path: str, name: str) -> list[dict]:
  """The runs of sweep `name` in the file at `path`: its get_sweep(name), else SWEEPS[name]."""
  module = load_module(path)
  if hasattr(module, "get_sweep"):
    return list(module.get_sweep(name))
  table = getattr(module, "SWEEPS", None)
  if not isinstance(table, dict):
    raise SystemExit(f"error: {path} defines neither get_sweep(name) nor a SWEEPS dict")
  if name not in table:
    raise SystemExit(f"error: {path} has no sweep {name!r}; sweeps: {', '.join(sorted(table))}")
  runs = table[name]
  return list(runs() if callable(runs) else runs)


def expand(
  config_arg: str, sweep_arg: str, workdir: str, extra: list[str], imports: tuple = ()
) -> list[dict]:
  """[{name, overrides, workdir, command}] for every run of the sweep."""
  sweep_path, sweep_name = _split(sweep_arg)
  if sweep_name is None:
    raise SystemExit(f"error: --sweep={sweep_arg!r} names no sweep; use path:name")
  cli.import_modules(imports)  # a user's method, before its config section is needed
  config = preflight.load_config(config_arg)  # a missing file or bad variant: cli.UserError
  runs = load_sweep(sweep_path, sweep_name)
  workdir = str(workdir).rstrip("/") or workdir
  out, seen = [], set()
  for i, overrides in enumerate(runs):
    check_overrides(config, overrides, f"{sweep_name}[{i}]")
    name = run_name(overrides)
    if name in seen:
      raise SystemExit(f"error: sweep {sweep_name} has two runs named {name!r}")
    seen.add(name)
    run_dir = f"{workdir}/{name}"  # a local path or gs://BUCKET/DIR/<name>
    script = script_for(overrides.get("method"))
    cmd = [sys.executable, script, f"--config={config_arg}", f"--workdir={run_dir}"]
    cmd += [f"--import={v}" for v in imports]
    cmd += [f"--config.{k}={v}" for k, v in overrides.items() if k != "name"] + list(extra)
    out.append(
      {
        "name": name,
        "overrides": {k: v for k, v in overrides.items() if k != "name"},
        "workdir": run_dir,
        "command": cmd,
      }
    )
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", required=True, help="config file[:variant], as for launch/train.py")
  p.add_argument(
    "--sweep",
    required=True,
    help="sweep file:name, e.g. configs/sweeps.py:pq (a file with get_sweep(name) or SWEEPS)",
  )
  p.add_argument("--import", dest="imports", action="append", default=[], help=cli.IMPORT_HELP)
  p.add_argument(
    "--workdir", required=True, help="root (local or gs://); each run goes to <workdir>/<run name>"
  )
  p.add_argument("--print_commands", action="store_true", help="print one command per run")
  p.add_argument("--dry_run", action="store_true", help="print the expanded runs as JSON")
  args, extra = p.parse_known_args(argv)
  runs = expand(args.config, args.sweep, args.workdir, extra, tuple(args.imports))
  if args.dry_run:
    print(json.dumps(runs, indent=1))
    return 0
  if args.print_commands:
    for r in runs:
      print(shlex.join(r["command"]))
    return 0
  preflight.check_workdir(args.workdir)  # a file, or gs:// without gcsfs: one line, exit 2
  from empo2_jax.data.storage import check_gcs_access

  check_gcs_access(args.workdir, "--workdir")  # gs:// without credentials: one line, exit 2
  root = epath.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)  # gs://: no directories to make
  (root / "sweep.json").write_text(json.dumps(runs, indent=1))
  failed = []
  for i, r in enumerate(runs):
    print(f"[{i + 1}/{len(runs)}] {r['name']}: {shlex.join(r['command'])}", flush=True)
    if subprocess.run(r["command"], check=False).returncode != 0:
      failed.append(r["name"])
  if failed:
    print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1
  print(
    f"done: {len(runs)} runs under {args.workdir}; "
    f"plot: python launch/plot.py --workdirs={args.workdir} --out={args.workdir}/plots"
  )
  return 0


if __name__ == "__main__":
  cli.guard(main)  # one-line errors for config and path mistakes (exit 2)
