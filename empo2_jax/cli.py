"""One-line errors for the launch scripts (launch/*.py).

    from empo2_jax import cli
    if __name__ == "__main__":
      cli.run(main)                        # absl scripts (--config, --workdir flags)
      cli.run(main, checks=(my_check,))    # my_check(FLAGS) runs after parsing, before main
      cli.guard(main)                      # argparse scripts: main() returns the exit status

A user's mistake (the config file or its variant, a --config.* key or value, the model
checkpoint, a checkpoint directory, data, a path) prints ONE line to stderr,

    error: <what went wrong> (<file or key>): <what to do>

and exits with status 2. The checks that need no JAX (the config, the model files' headers, the
workdir) run before `main`, so these errors come back in about a second. With --debug (or
EMPO2_DEBUG=1 in the environment) the exception is raised instead, with its traceback. Any other
exception is a bug and keeps its traceback. A script's own `sys.exit("error: ...")` is left as it
is (exit status 1: faults of a running job, such as a failed save).

The command lines that run a method (`command_lines`, `not_training_message`) and the config keys
a command line sets (`explicit_keys`, which `methods.apply` keeps) are here too, beside the
scripts that print and read them.

`--import=MODULE_OR_FILE` (repeatable) on a script that builds a config imports a module
(`my_pkg.my_method`) or a Python file (`path/to/my_method.py`) before the config is built, so a
method, estimator or environment it registers is known to the config, the checks and the
trainer: `import_modules` below, called by `run` (and by the argparse scripts' `main`).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Callable, Iterable, NoReturn, Optional, Sequence

from empo2_jax.errors import UserError

EXIT_USER = 2

# Exception classes (by module and name) that are the user's to fix. They are looked up in
# sys.modules when an exception arrives, so this module imports none of them (no JAX here).
_USER_ERRORS = (
  ("empo2_jax.errors", "UserError"),
  ("empo2_jax.model.safetensors_io", "CheckpointError"),
  ("empo2_jax.train.build", "ConfigError"),
  ("empo2_jax.methods", "UnknownMethod"),
  ("builtins", "FileNotFoundError"),
  ("builtins", "NotADirectoryError"),
  ("builtins", "IsADirectoryError"),
  ("google.auth.exceptions", "DefaultCredentialsError"),  # gs:// without credentials
)


def debug_requested(argv: Optional[Iterable[str]] = None) -> bool:
  """--debug / --debug=true on the command line, or EMPO2_DEBUG=1 in the environment."""
  argv = sys.argv if argv is None else argv
  if os.environ.get("EMPO2_DEBUG", "").strip().lower() in ("1", "true", "yes"):
    return True
  return any(a in ("--debug", "--debug=true", "--debug=True", "--debug=1") for a in argv)


def is_user_error(error: BaseException) -> bool:
  for module, name in _USER_ERRORS:
    cls = getattr(sys.modules.get(module), name, None)
    if isinstance(cls, type) and isinstance(error, cls):
      return True
  return False


def one_line(error: BaseException) -> str:
  """'error: ...' on one line: a UserError as it reads; others as their message, lines joined."""
  text = str(error) if isinstance(error, UserError) else _message(error)
  parts = [p.strip() for p in text.splitlines() if p.strip()]
  return "error: " + "; ".join(parts)


def _message(error: BaseException) -> str:
  if isinstance(error, OSError) and error.filename is not None:  # FileNotFoundError(errno, ...)
    return f"{error.strerror or type(error).__name__} ({error.filename}): check the path"
  text = str(error).strip()
  if isinstance(error, KeyError) and error.args:
    text = str(error.args[0])
  return text or type(error).__name__


def fail(error: BaseException) -> NoReturn:
  """Print the one-line form of `error` to stderr and exit with status 2."""
  sys.stdout.flush()
  print(one_line(error), file=sys.stderr, flush=True)
  raise SystemExit(EXIT_USER)


def guard(main: Callable[[], Optional[int]]) -> NoReturn:
  """Run an argparse script's main(); user errors become one line and exit status 2."""
  debug = debug_requested()
  sys.argv = [a for a in sys.argv if not a.startswith("--debug")]
  try:
    code = main()
  except Exception as e:  # noqa: BLE001 - sorted into the user's and bugs just below
    if debug or not is_user_error(e):
      raise
    fail(e)
  raise SystemExit(code)


def run(main: Callable, *, checks: Iterable[Callable] = ()) -> NoReturn:
  """absl's app.run(main) with one-line user errors (see the module docstring).

  Before absl parses the flags, the --config file is loaded and every --config.<key> override
  is checked against it (an unknown key lists the valid ones); after parsing, the model
  checkpoint and --workdir are checked (empo2_jax/preflight.py), JAX's persistent compilation
  cache is set (empo2_jax/compile_cache.py), then each of `checks` is called with absl's FLAGS
  (raise UserError to refuse)."""
  from absl import app, flags

  if "debug" not in flags.FLAGS:
    flags.DEFINE_bool("debug", False, "show the traceback of an error (also: EMPO2_DEBUG=1)")
  if "import" not in flags.FLAGS:
    flags.DEFINE_multi_string("import", [], IMPORT_HELP)
    # listed by the script's own --help (absl shows the main module's key flags there)
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS["import"])
  debug = debug_requested()
  checks = tuple(checks)

  def parse(argv):
    from empo2_jax import preflight

    import_modules(import_values(argv))  # before the config file is loaded
    spec = _flag_value(argv, "config")
    if spec is not None:
      preflight.check_overrides(argv[1:], preflight.load_config(spec))
    try:
      rest = flags.FLAGS(argv)
    except flags.Error as e:
      raise UserError(
        f"bad command line: {str(e).splitlines()[0]}", "flags", "see --helpshort"
      ) from e
    preflight.check_flags(flags.FLAGS)
    _apply_compilation_cache(flags.FLAGS)
    for check in checks:
      check(flags.FLAGS)
    return rest

  try:
    app.run(main, flags_parser=parse)
  except SystemExit:
    raise
  except Exception as e:  # noqa: BLE001 - sorted into the user's and bugs just below
    if debug or not is_user_error(e):
      raise
    fail(e)
  raise SystemExit(0)  # not reached: app.run exits


IMPORT_HELP = (
  "a module (my_pkg.my_method) or a Python file (path/to/my_method.py) to import before the "
  "config is built, e.g. one that registers a method; repeatable"
)
_IMPORTED: dict[str, object] = {}  # value -> module: each is imported once per process


def import_values(argv: Iterable[str]) -> list[str]:
  """The values of every --import=V / --import V in argv, in order."""
  argv, out = list(argv), []
  for i, a in enumerate(argv):
    if a.startswith("--import="):
      out.append(a.split("=", 1)[1])
    elif a == "--import" and i + 1 < len(argv):
      out.append(argv[i + 1])
  return out


def import_modules(values: Iterable[str]) -> list:
  """Import each value once: a path to an existing file (or one ending in .py) by its location,
  else a module name through the import path. A missing file or module is the user's error."""
  import importlib
  import importlib.util

  modules = []
  for value in values:
    if value in _IMPORTED:
      modules.append(_IMPORTED[value])
      continue
    if value.endswith(".py") or os.path.isfile(value):
      if not os.path.isfile(value):
        raise UserError(f"no such file: {value!r}", "--import", "give a .py file or a module")
      path = os.path.abspath(value)
      name = "empo2_user_" + "".join(
        ch if ch.isalnum() else "_" for ch in os.path.splitext(os.path.basename(path))[0]
      )
      spec = importlib.util.spec_from_file_location(name, path)
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module  # dataclasses and pickling look the module up by name
      try:
        spec.loader.exec_module(module)
      except BaseException:
        del sys.modules[name]
        raise
    else:
      try:
        module = importlib.import_module(value)
      except ModuleNotFoundError as e:
        if e.name is None or not value.startswith(e.name):
          raise  # the module exists and one of its own imports is missing: a real error
        raise UserError(
          f"no module named {value!r}",
          "--import",
          "install it, add its directory to PYTHONPATH, or give the .py file's path",
        ) from e
    _IMPORTED[value] = module
    modules.append(module)
  return modules


def _apply_compilation_cache(flag_values) -> None:
  """JAX's persistent compilation cache from --config's train.compilation_cache ("auto" for a
  script without --config), beside --workdir when that is gs:// (empo2_jax/compile_cache.py)."""
  from empo2_jax import compile_cache

  setting = "auto"
  config = flag_values["config"].value if "config" in flag_values else None
  if config is not None and "train" in config and "compilation_cache" in config.train:
    setting = config.train.compilation_cache
  workdir = flag_values["workdir"].value if "workdir" in flag_values else None
  compile_cache.apply(setting, workdir)


def _flag_value(argv: list[str], name: str) -> Optional[str]:
  """The value of --name=V or --name V in argv (the last one), else None."""
  value = None
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      value = a.split("=", 1)[1]
    elif a == f"--{name}" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


__all__ = [
  "UserError",
  "run",
  "guard",
  "fail",
  "one_line",
  "is_user_error",
  "debug_requested",
  "import_modules",
  "import_values",
  "IMPORT_HELP",
]


# -- the command lines of a method -----------------------------------------------------------------
# The standard launch command of a method registered without its own (methods/base.Method.commands)
TRAIN_COMMAND = (
  "{python} launch/train.py --config={config} --config.method={name} --workdir={workdir}"
)
EVAL_COMMAND = "{python} launch/eval.py --config={config} --method={name} --workdir={workdir}"


def command_lines(
  method,
  config: str,
  workdir: str,
  python: str = "python",
  evaluate: bool = False,
  episodes: str = "RUN_WITH_SAVED_EPISODES",
) -> list[str]:
  """The shell commands that run `method` (a methods.Method) with config spec `config` into
  `workdir`: its own templates, else TRAIN_COMMAND (a training method) or EVAL_COMMAND.
  evaluate=True adds the evaluation of a training method's run (launch/eval.py, which writes the
  eval/result.json that launch/table.py reads; the other methods write it themselves). `episodes`
  fills {episodes} (Retrospex: runs trained with train.save_episodes=True)."""
  fields = dict(
    python=python,
    config=shlex.quote(config),
    workdir=shlex.quote(workdir),
    name=method.name,
    episodes=shlex.quote(episodes),
  )
  lines = list(method.commands) or [TRAIN_COMMAND if method.trains else EVAL_COMMAND]
  lines += [EVAL_COMMAND] if evaluate and method.trains else []
  return [c.format(**fields) for c in lines]


def not_training_message(name: str, config: str = "CONFIG", workdir: str = "WORKDIR") -> str:
  """What launch/train.py says of a method that does not train: the commands that run it."""
  from empo2_jax import methods

  m = methods.get(name)
  return (
    f"method {name!r} ({m.description}) does not train with launch/train.py; run it with:\n  "
    + "\n  ".join(command_lines(m, config, workdir))
  )


def explicit_keys(argv: Sequence[str]) -> set[str]:
  """The dotted config paths set on a command line (--config.a.b=v, --config.a.b v,
  --noconfig.a.b): methods.apply keeps their values over a method's overrides."""
  out = set()
  for arg in argv:
    for prefix in ("--config.", "--noconfig."):
      if arg.startswith(prefix):
        out.add(arg[len(prefix) :].split("=", 1)[0])
  return out
