"""Every launch/ script answers a user's mistake with ONE stderr line, `error: <what> (<where>):
<what to do>`, and exit status 2 (empo2_jax/cli.py); --debug or EMPO2_DEBUG=1 shows the traceback.

Each case runs the script in a subprocess. The checks run before JAX starts, so each takes about
a second (the test asserts no timing; the subprocess timeout only stops a hang)."""

import errno
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCI = "--config=configs/sciworld.py"
TINY = "--config=configs/sciworld.py:tiny"


def _files(tmp) -> dict:
  """The broken inputs, by name."""
  (tmp / "empty.gguf").write_bytes(b"")
  (tmp / "notgguf.gguf").write_bytes(b"PK\x03\x04 a zip, not a gguf")
  fields = tmp / "nofields"
  fields.mkdir()
  (fields / "config.json").write_text(json.dumps({"model_type": "llama"}))
  full = {
    "model_type": "llama",
    "vocab_size": 16,
    "hidden_size": 8,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
  }
  header = tmp / "badheader"
  header.mkdir()
  (header / "config.json").write_text(json.dumps(full))
  (header / "model.safetensors").write_bytes((2**32 - 1).to_bytes(8, "little") + b"{}")
  notjson = tmp / "notjson"
  notjson.mkdir()
  (notjson / "config.json").write_text("{not json")
  noweights = tmp / "noweights"
  noweights.mkdir()
  (noweights / "config.json").write_text(json.dumps(full))
  (tmp / "afile").write_text("a file, not a directory")
  (tmp / "emptyrun").mkdir()
  return {
    "empty_gguf": tmp / "empty.gguf",
    "not_gguf": tmp / "notgguf.gguf",
    "no_fields": fields,
    "bad_header": header,
    "not_json": notjson,
    "no_weights": noweights,
    "file": tmp / "afile",
    "empty_run": tmp / "emptyrun",
    "missing": tmp / "does-not-exist",
  }


# (id, script, args with {name} placeholders, words the line must contain)
CASES = [
  ("unknown variant", "train.py", [f"{SCI}:nope"], ["nope", "configs/sciworld.py"]),
  ("no model checkpoint", "train.py", [SCI, "--workdir={missing}"], ["config.model.checkpoint"]),
  ("missing config file", "train.py", ["--config=configs/nope.py"], ["configs/nope.py"]),
  ("unknown key", "train.py", [TINY, "--config.train.itrations=1"], ["itrations", "iterations"]),
  ("bad value", "train.py", [TINY, "--config.train.iterations=abc"], ["abc"]),
  (
    "missing model dir",
    "train.py",
    [SCI, "--config.model.checkpoint={missing}"],
    ["does-not-exist", "--config.model.checkpoint"],
  ),
  ("empty gguf", "train.py", [SCI, "--config.model.checkpoint={empty_gguf}"], ["empty.gguf"]),
  ("not a gguf", "train.py", [SCI, "--config.model.checkpoint={not_gguf}"], ["notgguf.gguf"]),
  (
    "bad safetensors header",
    "train.py",
    [SCI, "--config.model.checkpoint={bad_header}"],
    ["model.safetensors", "header"],
  ),
  (
    "config.json without fields",
    "train.py",
    [SCI, "--config.model.checkpoint={no_fields}"],
    ["nofields", "hidden_size"],
  ),
  ("config.json not JSON", "train.py", [SCI, "--config.model.checkpoint={not_json}"], ["notjson"]),
  ("no weights", "train.py", [SCI, "--config.model.checkpoint={no_weights}"], ["noweights"]),
  ("workdir is a file", "train.py", [TINY, "--workdir={file}"], ["afile"]),
  (
    "workdir under a file",
    "train.py",
    [TINY, "--workdir={file}/run"],
    ["cannot be created", "afile is a file, not a directory"],
  ),
  (
    "workdir where no directory can be made",
    "train.py",
    [TINY, "--workdir=/proc/empo2-run"],
    ["cannot be created", "/proc does not allow new directories"],
  ),
  ("eval: empty workdir", "eval.py", [TINY, "--workdir={empty_run}"], ["emptyrun", "--initial"]),
  ("eval: misspelled workdir", "eval.py", [TINY, "--workdir={missing}"], ["does-not-exist"]),
  ("eval: workdir is a file", "eval.py", [TINY, "--workdir={file}"], ["afile"]),
  ("sft: empty gguf", "sft.py", [SCI, "--config.model.checkpoint={empty_gguf}"], ["empty.gguf"]),
  ("spa: missing config", "spa.py", ["--config=configs/nope.py"], ["nope.py"]),
  ("adapt: bad variant", "adapt.py", [f"{SCI}:nope", "--workdir=x", "--task=t"], ["nope"]),
  ("retrospex: missing config", "retrospex.py", ["eval", "--config=nope.py"], ["nope.py"]),
  (
    "sweep: bad variant",
    "sweep.py",
    [f"{SCI}:nope", "--sweep=configs/sweeps.py:pq", "--workdir={missing}", "--print_commands"],
    ["nope"],
  ),
  ("plot: no runs", "plot.py", ["--workdirs={empty_run}", "--out={missing}"], ["emptyrun"]),
  ("table: no results", "table.py", ["--runs={empty_run}", "--out={missing}"], ["emptyrun"]),
]


def _run(script, args, env_extra=None, no_gcsfs=False):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("EMPO2_DEBUG", None)
  env.update(env_extra or {})
  path = os.path.join(ROOT, "launch", script)
  # no_gcsfs: the script runs as if gcsfs were not installed (None in sys.modules hides it)
  hide = (
    "import runpy, sys; sys.modules['gcsfs'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
  )
  return subprocess.run(
    [sys.executable, *(["-c", hide] if no_gcsfs else []), path, *args],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=ROOT,
    env=env,
  )


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_line_error_and_exit_2(case, tmp_path):
  _, script, args, words = case
  files = _files(tmp_path)
  out = _run(script, [a.format(**files) for a in args])
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2, out.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  for word in words:
    assert word in lines[0], (word, lines[0])
  assert not files["missing"].exists()  # read-only and refused commands create nothing


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(how, tmp_path):
  gguf = _files(tmp_path)["empty_gguf"]
  args = [SCI, f"--config.model.checkpoint={gguf}"]
  if how == "flag":
    out = _run("train.py", [*args, "--debug"])
  else:
    out = _run("train.py", args, {"EMPO2_DEBUG": "1"})
  assert out.returncode not in (0, 2)
  assert "Traceback" in out.stderr and "UserError" in out.stderr


def test_gs_path_without_gcsfs_names_the_extra(tmp_path):
  out = _run("train.py", [SCI, "--config.model.checkpoint=gs://b/m"], no_gcsfs=True)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith("error: ") and "gs://b/m" in lines[0] and "empo2_jax[gcs]" in lines[0]


def test_one_line_keeps_the_structure():
  from empo2_jax import cli

  e = cli.UserError("the thing broke", "/some/file", "fix it")
  assert cli.one_line(e) == "error: the thing broke (/some/file): fix it"
  assert cli.one_line(ValueError("a\n  b\n")) == "error: a; b"
  assert cli.is_user_error(e) and not cli.is_user_error(ValueError("x"))


@pytest.mark.parametrize(
  "code, words",
  [
    (errno.EROFS, "read-only file system"),
    (errno.EACCES, "permission denied in"),
    (errno.ENOSPC, "no space left"),
  ],
)
def test_workdir_creation_problem_says_why(code, words, tmp_path, monkeypatch):
  from empo2_jax import preflight

  def refuse(path, *args, **kwargs):
    raise OSError(code, os.strerror(code), path)

  monkeypatch.setattr(os, "mkdir", refuse)
  with pytest.raises(preflight.UserError) as e:
    preflight.check_workdir(str(tmp_path / "a" / "b"))
  assert words in str(e.value) and str(tmp_path) in str(e.value)
  monkeypatch.undo()
  assert preflight.creation_problem(str(tmp_path / "a" / "b")) is None
  assert not (tmp_path / "a").exists()  # the check leaves nothing behind
