"""Checks of a command line that need no JAX: the config file, override keys, the model files'
headers, the workdir. Each raises empo2_jax.cli.UserError (what, where, what to do); the launch
scripts run them before anything heavy starts (empo2_jax/cli.py).

These checks are a fast first pass; the loaders (model/hf.py, model/gguf_io.py,
train/checkpoint.py) still check everything they read.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from empo2_jax import config_keys
from empo2_jax.errors import UserError
from empo2_jax.remote import check as check_remote
from empo2_jax.remote import is_remote

# What LlamaConfig.from_hf_dict (model/configs.py) cannot do without; it stays the authority.
HF_CONFIG_FIELDS = (
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
)


def load_config(spec: str):
  """defaults.load_config(spec) with its failures as UserError."""
  from empo2_jax import defaults

  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    what = "config file is a directory" if os.path.isdir(path) else "no such config file"
    raise UserError(
      what, path, "pass --config=configs/<name>.py[:variant], e.g. configs/sciworld.py"
    )
  try:
    return defaults.load_config(spec)
  except ValueError as e:  # parse_args: an unknown or malformed variant
    raise UserError(f"bad config variant {arg!r}: {e}", spec, "use one of the valid ones") from e


def check_overrides(args, config) -> None:
  """Every --config.<path>=value in `args` names an existing field of `config`."""
  for arg in args:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    key = arg.split("=", 1)[0]
    try:
      config_keys.lookup(config, key[len("--config.") :])
    except config_keys.UnknownKey as e:
      if e.renamed_to:
        raise UserError("renamed config key", key, f"use --config.{e.renamed_to}") from None
      raise UserError(
        f"unknown config key: {e.where} has no field {e.part!r}",
        key,
        f"valid keys: {', '.join(sorted(e.keys))}",
      ) from None


def check_flags(flag_values) -> None:
  """The checks every absl launch script gets: config.model.checkpoint / .tokenizer, --workdir."""
  config = getattr(flag_values, "config", None) if "config" in flag_values else None
  model = getattr(config, "model", None) if config is not None else None
  if model is not None:
    ckpt = model.get("checkpoint", "") if hasattr(model, "get") else ""
    if ckpt and not str(ckpt).startswith("embedded:"):
      check_model_path(str(ckpt), "--config.model.checkpoint")
    tok = model.get("tokenizer", "") if hasattr(model, "get") else ""
    if tok and not str(tok).startswith("embedded:"):
      check_exists(str(tok), "--config.model.tokenizer")
  if "workdir" in flag_values and flag_values["workdir"].value:
    for workdir in str(flag_values["workdir"].value).split(","):
      check_workdir(workdir)


def check_exists(path: str, key: str) -> None:
  check_remote(path)
  if not is_remote(path) and not os.path.exists(path):
    raise UserError(f"{key} names a path that does not exist", path, "check the path")


def check_workdir(path: str) -> None:
  """A workdir is a directory, or not there yet and creatable (train creates it); never a file.
  One that cannot be created says why: a file in its path, permission, a read-only file system."""
  check_remote(path)
  if is_remote(path):
    return
  if os.path.exists(path):
    if not os.path.isdir(path):
      raise UserError(
        "the workdir is a file, not a directory", path, "pass a directory (train creates it)"
      )
    return
  why = creation_problem(path)
  if why:
    raise UserError(
      f"the workdir cannot be created: {why}", path, "pass a directory you can write to"
    )


_CREATE_ERRORS = {
  errno.EACCES: "permission denied in {parent}",
  errno.EPERM: "{parent} does not allow new directories (operation not permitted)",
  errno.EROFS: "{parent} is on a read-only file system",
  errno.ENOENT: "{parent} does not allow new directories",
  errno.ENOSPC: "no space left on the device of {parent}",
  errno.EDQUOT: "the disk quota of {parent} is used up",
}


def creation_problem(path: str) -> str | None:
  """Why directory `path` (absent) cannot be created, or None: its nearest existing ancestor must
  be a directory in which a new directory can be made (tried: made and removed at once)."""
  parent, first = os.path.abspath(path), None
  while not os.path.exists(parent):
    parent, first = os.path.dirname(parent), parent
  if not os.path.isdir(parent):
    return f"{parent} is a file, not a directory"
  try:
    os.mkdir(first)
  except FileExistsError:  # made by another process meanwhile: it can be made
    return None
  except OSError as e:
    template = _CREATE_ERRORS.get(e.errno)
    return template.format(parent=parent) if template else f"{e.strerror} in {parent}"
  os.rmdir(first)
  return None


def check_model_path(path: str, key: str = "--config.model.checkpoint") -> None:
  """A model checkpoint: a .gguf file or a Hugging Face directory (config.json with the fields
  our model needs, safetensors files whose headers parse). Remote paths: only gcsfs is checked."""
  check_remote(path)
  if is_remote(path):  # one metadata request; the loader checks the files themselves
    from etils import epath

    if not epath.Path(path).exists():
      raise UserError(
        "the model checkpoint does not exist",
        path,
        f"check the bucket and path of {key}=gs://BUCKET/DIR (and your GCS credentials)",
      )
    return
  if not os.path.exists(path):
    raise UserError(
      "the model checkpoint does not exist",
      path,
      f"pass a Hugging Face model directory or a .gguf file as {key}=PATH",
    )
  if path.lower().endswith(".gguf") or os.path.isfile(path):
    _check_gguf(path)
    return
  _check_hf_dir(path)


def _check_gguf(path: str) -> None:
  if os.path.isdir(path):
    raise UserError("a .gguf path is a directory", path, "pass the .gguf file itself")
  size = os.path.getsize(path)
  if size == 0:
    raise UserError("the GGUF file is empty", path, "re-download or re-export it")
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise UserError(
      f"not a GGUF file (starts with {magic!r}, not b'GGUF')",
      path,
      "pass a .gguf file or a Hugging Face model directory",
    )


def _read_json(file: str) -> Any:
  try:
    with open(file, encoding="utf-8") as f:
      return json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"not valid JSON ({e})", file, "re-download or re-export the checkpoint") from e


def _check_hf_dir(path: str) -> None:
  cfg_file = os.path.join(path, "config.json")
  if not os.path.exists(cfg_file):
    raise UserError(
      "the model directory has no config.json",
      path,
      "pass a Hugging Face Llama/Qwen2 checkpoint directory or a .gguf file",
    )
  cfg = _read_json(cfg_file)
  if not isinstance(cfg, dict):
    raise UserError("config.json is not a JSON object", cfg_file, "re-download it")
  missing = [k for k in HF_CONFIG_FIELDS if k not in cfg]
  if missing:
    raise UserError(
      f"config.json lacks the fields {missing}",
      cfg_file,
      "use the model's original config.json (a Llama or Qwen2 causal LM)",
    )
  from empo2_jax.model.safetensors_io import header_problem

  files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise UserError(
      "the model directory has no .safetensors files",
      path,
      "only safetensors checkpoints load; convert .bin files first",
    )
  for name in files:
    file = os.path.join(path, name)
    problem = header_problem(file)
    if problem:
      raise UserError(
        f"bad safetensors file: {problem}", file, "re-download or re-export the checkpoint"
      )


__all__ = [
  "check_flags",
  "check_model_path",
  "check_workdir",
  "creation_problem",
  "check_overrides",
  "check_remote",
  "load_config",
]
