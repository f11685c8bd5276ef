"""The shell blocks (and inline `python ...` / `make ...` / `pip ...` spans) of the README and the
run pages name only what exists: every repository path, `make` target, `pip install`
requirements file and extra, `python launch/...` (or scripts/, bench/) script and the flags it is
given, `python -m empo2_jax...` module; every `--config=FILE[:VARIANT]` with its
`--config.KEY=VALUE` overrides parses as the launch scripts parse it (absl + ml_collections).
A page's placeholders (NAME, BUCKET, gs:// paths) are plain values and pass."""

from __future__ import annotations

import pathlib
import re

import pytest
from absl import flags
from ml_collections import config_flags

from tests.helpers import markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/tpu.md", "docs/running.md")
SHELL = {"bash", "sh", "shell", "console"}
PREFIXES = {"nohup", "sudo", "time", "exec", "env", "nice"}
# flags every absl launch script has (absl's own, and empo2_jax/cli.py's)
COMMON_FLAGS = {"helpshort", "helpfull", "help", "verbosity", "v", "debug", "import"}
FLAG_DEFINITION = re.compile(r"""(?:DEFINE_\w+|add_argument)\(\s*["'](?:--)?([\w-]+)["']""")


def shell_commands(lines: list[str]) -> list[list[str]]:
  """The commands of a shell block as token lists: continuations joined, comments dropped, quoted
  command strings (`ssh --command='...'`) split into their own commands."""
  text = re.sub(r"\\\n\s*", " ", "\n".join(lines))
  text = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())
  text = text.replace("'", "\n").replace('"', "")
  out = []
  for part in re.split(r"&&|\|\||[;|&\n]", text):
    tokens = part.split()
    while tokens and (tokens[0] in PREFIXES or re.match(r"^[A-Z_]+=", tokens[0])):
      tokens.pop(0)
    if tokens:
      out.append(tokens)
  return out


def _top_level(root: pathlib.Path) -> set[str]:
  return {
    p.name
    for p in root.iterdir()
    if not p.name.startswith(".") and p.name != "runs" and not p.name.endswith(".egg-info")
  }


def _path_problems(tokens: list[str], root: pathlib.Path) -> list[str]:
  """Tokens (or --flag=values) whose first component is a top-level entry of the repository:
  the path they name must exist (a `file.py:VARIANT` config spec: the file)."""
  top, out = _top_level(root), []
  for token in tokens:
    value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
    value = re.sub(r"^(\S+?\.py):\S*$", r"\1", value).rstrip(",")
    if value.split("/")[0] in top and not any(ch in value for ch in "*?[{$<"):
      if not (root / value).exists():
        out.append(f"no such file: {value}")
  return out


def _make_targets(root: pathlib.Path) -> set[str]:
  return set(re.findall(r"^([\w.-]+):", (root / "Makefile").read_text(), re.M))


def _pip_problems(tokens: list[str], root: pathlib.Path) -> list[str]:
  import tomllib

  extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  out = []
  for i, token in enumerate(tokens):
    if token == "-r" and i + 1 < len(tokens) and not (root / tokens[i + 1]).exists():
      out.append(f"no such requirements file: {tokens[i + 1]}")
    m = re.match(r"^\.\[([\w,-]+)\]$", token)
    if m:
      out += [f"no such extra: {e}" for e in m.group(1).split(",") if e not in extras]
  return out


def _config_problems(args: list[str], where: str) -> list[str]:
  """Parse --config=SPEC and its --config.KEY=VALUE overrides as a launch script does."""
  argv = ["prog", *[a for a in args if a.startswith(("--config=", "--config."))]]
  if len(argv) == 1:
    return []
  values = flags.FlagValues()
  try:
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    values.config  # noqa: B018 - loads the file and applies the overrides
  except Exception as e:  # noqa: BLE001 - any failure is the page's problem; report it
    return [f"{where}: {' '.join(argv[1:])}: {type(e).__name__}: {str(e).splitlines()[0]}"]
  return []


def _python_problems(tokens: list[str], root: pathlib.Path) -> list[str]:
  rest = [t for t in tokens[1:] if t not in ("-u", "-O")]
  if not rest or rest[0] == "-c":
    return []
  if rest[0] == "-m":
    module = rest[1] if len(rest) > 1 else ""
    if not module.startswith("empo2_jax"):
      return []
    base = root / module.replace(".", "/")
    found = base.with_suffix(".py").exists() or (base / "__init__.py").exists()
    return [] if found else [f"no such module: {module}"]
  script = root / rest[0]
  if rest[0].split("/")[0] not in _top_level(root):
    return []  # a file of the user's
  if not script.exists():
    return [f"no such script: {rest[0]}"]
  source = script.read_text()
  defined = set(FLAG_DEFINITION.findall(source)) | COMMON_FLAGS
  out = []
  for arg in rest[1:]:
    m = re.match(r"^--(?:no)?([\w-]+)", arg)
    name = m and m.group(1)
    if name and not name.startswith("config") and m.group(0)[2:] not in defined:
      if name not in defined:
        out.append(f"{rest[0]} has no flag --{m.group(0)[2:]}")
  return out + _config_problems(rest[1:], rest[0])


def _inline_commands(prose: list[tuple[int, str]]) -> list[markdown.Block]:
  """Inline code spans in the prose that are commands (`python ...`, `make ...`, `pip ...`), each
  as a one-line block at the line it starts on."""
  text = "\n".join(line for _, line in prose)
  out, first = [], prose[0][0] if prose else 1
  for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
    span = " ".join(m.group(1).split())
    if re.match(r"^(python\S*|make|pip) ", span):
      line = [n for n, _ in prose][text.count("\n", 0, m.start())] if prose else first
      out.append(markdown.Block("bash", line, [span], True))
  return out


def problems(text: str, root: pathlib.Path = ROOT) -> list[str]:
  """What a page's shell blocks and inline command spans name that does not exist or parse."""
  blocks, prose = markdown.parse(text)
  targets, out = _make_targets(root), []
  for block in blocks + _inline_commands(prose):
    if block.lang not in SHELL:
      continue
    for tokens in shell_commands(block.lines):
      found = _path_problems(tokens, root)
      program = tokens[0].split("/")[-1]
      if program == "make":
        found += [
          f"no make target: {t}" for t in tokens[1:] if not t.startswith("-") and t not in targets
        ]
      elif re.match(r"^python(3(\.\d+)?)?$", program):
        found += _python_problems(tokens, root)
      elif program in ("pip", "pip3"):
        found += _pip_problems(tokens, root)
      out += [f"line {block.start}: {p}" for p in found]
  return out


@pytest.mark.parametrize("page", PAGES)
def test_shell_blocks_name_what_exists(page):
  found = problems((ROOT / page).read_text())
  assert not found, f"{page}:\n" + "\n".join(found)


def test_the_check_names_a_missing_file_target_script_key_and_extra(tmp_path):
  # a copy of the files the checker reads, less one script: every kind of mistake is named
  for name in ("Makefile", "pyproject.toml", "requirements.txt"):
    (tmp_path / name).write_text((ROOT / name).read_text())
  (tmp_path / "launch").mkdir()
  (tmp_path / "configs").symlink_to(ROOT / "configs")
  (tmp_path / "launch" / "train.py").write_text((ROOT / "launch" / "train.py").read_text())
  page = "\n".join(
    [
      "```bash",
      "make train && make no-such-target",
      'pip install -r requirements.txt -r requirements-gone.txt -e ".[tpu,nosuchextra]"',
      "python launch/train.py --config=configs/sciworld.py:cpu --workdir=runs/x \\",
      "    --config.env.no_such_key=1 --no_such_flag",
      "python launch/aot.py --program=train_step",
      "python launch/train.py --config=configs/sciworld.py:cpu --config.env.max_steps=four",
      "python -m empo2_jax.model.no_such_module",
      "```",
    ]
  )
  found = "\n".join(problems(page, tmp_path))
  for expected in (
    "no make target: no-such-target",
    "no such requirements file: requirements-gone.txt",
    "no such extra: nosuchextra",
    "config.env.no_such_key",
    "launch/train.py has no flag --no_such_flag",
    "no such file: launch/aot.py",
    "no such script: launch/aot.py",
    "config.env.max_steps=four",
    "no such module: empo2_jax.model.no_such_module",
  ):
    assert expected in found, found
  assert "make train" not in found and "requirements.txt\n" not in found
