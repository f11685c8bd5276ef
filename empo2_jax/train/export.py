"""A run's checkpoint (RL: <workdir>/checkpoints, SFT: <workdir>/sft/checkpoints) -> a Hugging Face
directory: model.safetensors (sharded past 4 GiB) + config.json (model/hf.py's writer), the
tokenizer files and its chat template (tokenizer.save_pretrained).

    summary = export_run("runs/grpo", "runs/grpo/hf")            # the newest step
    summary = export_run("runs/sft_learn", "out/sft", step=40)   # an SFT run's step 40

Reading is read-only: orbax opens the checkpoint directory with read_only=True, so exporting
while the run still trains neither creates nor cleans anything there. The model's architecture
comes from the run's own config (the checkpoint's meta): the config.json of the model it started
from, the .gguf's metadata, or the random-init preset; the tokenizer likewise (build.tokenizer).
Only the params are read (an orbax partial restore of the state item's `train.params` sub-tree,
as numpy arrays): the AdamW moments, two more copies of the params, stay on disk. A LoRA run's
checkpoint holds its adapters, not the frozen base: the base is loaded from the run's
model.checkpoint (its fingerprint checked against the one the checkpoint recorded), the adapters
are merged into it in float32, and `peft_out` also gets the adapters alone in peft's layout
(adapter_model.safetensors + adapter_config.json; model/lora.py).
"""

from __future__ import annotations

import json
from typing import Optional

import numpy as np

from etils import epath

from empo2_jax import remote
from empo2_jax.errors import UserError

KINDS = {"rl": "checkpoints", "sft": "sft/checkpoints"}


def checkpoint_dir(workdir: str) -> tuple[str, epath.Path]:
  """(kind, directory) of the run's checkpoints: RL if it has steps, else SFT; UserError if
  neither has one."""
  root = epath.Path(workdir)
  for kind, sub in KINDS.items():
    d = root / sub
    if d.is_dir() and steps(d):
      return kind, d
  raise UserError(
    "no checkpoint in the workdir",
    str(workdir),
    "pass the --workdir of a launch/train.py or launch/sft.py run that has saved a checkpoint "
    "(<workdir>/checkpoints/<step> or <workdir>/sft/checkpoints/<step>)",
  )


def steps(directory: epath.Path) -> list[int]:
  """The complete steps in an orbax directory (its temporary, unfinished ones are skipped)."""
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def restore(directory: epath.Path, step: Optional[int] = None) -> tuple[int, dict, dict]:
  """(step, params as numpy arrays, meta) of `step` (default: the newest), read-only."""
  import jax
  import orbax.checkpoint as ocp

  from empo2_jax.train.checkpoint import META, STATE

  have = steps(directory)
  if step is None:
    step = have[-1]
  elif step not in have:
    raise UserError(f"no step {step} in the checkpoints", str(directory), f"steps there: {have}")
  mgr = ocp.CheckpointManager(
    directory,
    item_handlers={STATE: ocp.PyTreeCheckpointHandler(), META: ocp.JsonCheckpointHandler()},
    options=ocp.CheckpointManagerOptions(create=False, read_only=True),
  )
  try:
    # The saved tree is {"train": TrainState(params, opt_state, step) as a dict, "rng": ...};
    # its metadata gives the params' structure, and a partial restore reads only those leaves.
    saved = mgr.item_metadata(step)[STATE].tree
    if not isinstance(saved.get("train"), dict) or "params" not in saved["train"]:
      where = str(directory / str(step))
      raise UserError("the checkpoint's state has no train.params", where, "pass a run's workdir")
    params_meta = saved["train"]["params"]
    target = {"train": {"params": params_meta}}
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    out = mgr.restore(
      step,
      args=ocp.args.Composite(
        **{
          STATE: ocp.args.PyTreeRestore(target, restore_args=as_numpy, partial_restore=True),
          META: ocp.args.JsonRestore(),
        }
      ),
    )
  finally:
    mgr.close()
  params = out[STATE]["train"]["params"]
  return step, jax.tree.map(np.asarray, params), dict(out[META])


def model_config(c):
  """The LlamaConfig of a run's config without reading any weights."""
  from empo2_jax.model import configs as model_configs
  from empo2_jax.model import hf
  from empo2_jax.train import build

  kw = dict(param_dtype=c.model.param_dtype, **build.lora_overrides(c))
  if not c.model.checkpoint:
    return model_configs.get_preset(c.model.preset, **kw)
  path = build.checkpoint_path(c)
  if hf.is_gguf(path):
    from empo2_jax.model import gguf

    with gguf.open_gguf(path) as reader:
      names, meta = [t.name for t in reader.tensors], gguf.metadata(reader)
    return gguf.config_from_metadata(meta, names, **kw)
  text = (epath.Path(path) / "config.json").read_text()
  return model_configs.LlamaConfig.from_hf_dict(json.loads(text), **kw)


def with_lora_base(c, adapters: dict, meta: dict, where: str):
  """(config, params) of a LoRA run's checkpoint: its adapters on the base the run started from
  (build.base_policy of its config), cast to float32 for the merge; UserError when that base's
  fingerprint is not the one the checkpoint recorded."""
  import jax

  from empo2_jax.model import lora
  from empo2_jax.train import build

  config, base = build.base_policy(c)
  if lora.fingerprint(base) != meta.get("lora_base"):
    raise UserError(
      "the LoRA checkpoint's base weights differ from the run's model.checkpoint now", where,
      "export with the base the run trained on (its model.checkpoint, model.param_dtype)",
    )  # fmt: skip
  base = jax.tree.map(lambda x: np.asarray(x, np.float32), base)
  return config.replace(param_dtype="float32"), lora.join(adapters, base)


def export_run(
  workdir: str, out: str, step: Optional[int] = None, peft_out: Optional[str] = None
) -> dict:
  """Write the HF directory `out` from `workdir`'s checkpoint (a LoRA run's adapters merged into
  its base, in float32), and with `peft_out` a LoRA run's adapters in peft's layout; returns
  what was written."""
  import ml_collections

  from empo2_jax.model import hf, lora
  from empo2_jax.train import build

  kind, directory = checkpoint_dir(workdir)
  step, params, meta = restore(directory, step)
  where = str(directory / str(step))
  if "config" not in meta:
    raise UserError("the checkpoint's meta has no config", where, "re-save it")
  c = ml_collections.ConfigDict(meta["config"])
  adapters = lora.split(params)[0]
  if adapters and "embed" not in params:  # a LoRA run's: the base where model.checkpoint points
    config, params = with_lora_base(c, adapters, meta, where)
  else:  # full fine-tuning, or an SFT checkpoint (it holds its base beside the adapters)
    config = model_config(c)
  if peft_out and not adapters:
    raise UserError("not a LoRA run: no adapters to write", where, "leave --peft_adapters out")
  if peft_out:
    hf.save_lora_adapters(peft_out, config, params, base_model=c.model.checkpoint)
  hf.save_checkpoint(out, config, params)
  tokenizer = build.tokenizer(c)
  with remote.writable_dir(out) as local:  # gs://: a temp dir, uploaded, then removed
    tokenizer.save_pretrained(local)
  return {
    "kind": kind,
    "step": step,
    "checkpoint": str(directory / str(step)),
    "out": str(out),
    "architecture": config.architecture,
    "layers": config.num_layers,
  }


__all__ = ["export_run", "checkpoint_dir", "restore", "model_config", "steps"]
