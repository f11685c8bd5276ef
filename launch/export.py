"""Export a run's checkpoint as a Hugging Face directory (transformers loads it; so does
launch/train.py's --config.model.checkpoint).

  python launch/export.py --workdir=runs/grpo --out=runs/grpo/hf              # newest RL step
  python launch/export.py --workdir=runs/sft_learn --step=40 --out=/tmp/sft40  # an SFT step
  python launch/export.py --workdir=gs://bucket/runs/x --out=gs://bucket/models/x
  python launch/export.py --workdir=runs/lora --out=runs/lora/hf --peft_adapters=runs/lora/peft

Reads <workdir>/checkpoints (launch/train.py) or, when that has no step, <workdir>/sft/checkpoints
(launch/sft.py), without writing there; writes model.safetensors (or shards + index), config.json,
the tokenizer files and its chat template to --out (empo2_jax/train/export.py); a LoRA run's
adapters are merged into its base (and written alone in peft's layout to --peft_adapters). Prints
one line:
  exported kind=rl step=N checkpoint=... out=... architecture=... layers=...
"""

import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402

from empo2_jax import cli  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "the run's workdir", required=True)
_OUT = flags.DEFINE_string("out", None, "the Hugging Face directory to write", required=True)
_STEP = flags.DEFINE_integer("step", None, "the checkpoint step (default: the newest)")
_PEFT = flags.DEFINE_string(
  "peft_adapters", None, "a LoRA run: also write its adapters alone in peft's layout here"
)


def _check(flag_values) -> None:
  """Before JAX starts: the workdir has a checkpoint step (cli.UserError otherwise)."""
  from empo2_jax.train import export

  kind, directory = export.checkpoint_dir(flag_values.workdir)
  have = export.steps(directory)
  if flag_values.step is not None and flag_values.step not in have:
    raise cli.UserError(
      f"no step {flag_values.step} in the {kind} checkpoints",
      str(directory),
      f"pass one of --step={','.join(map(str, have))} or leave --step out for the newest",
    )
  from empo2_jax import preflight

  preflight.check_workdir(flag_values.out)  # a directory or nothing yet; gs:// needs gcsfs


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # keep orbax's INFO lines out of the way
    logging.set_verbosity(logging.WARNING)
  from empo2_jax.train import export

  s = export.export_run(_WORKDIR.value, _OUT.value, _STEP.value, peft_out=_PEFT.value)
  print("exported " + " ".join(f"{k}={v}" for k, v in s.items()), flush=True)
  return 0


if __name__ == "__main__":
  cli.run(main, checks=(_check,))
