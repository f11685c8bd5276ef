"""Compile a program for a TPU topology on this (CPU) machine and report whether it fits HBM.

  python launch/aot.py --program=lm_train_step --preset=7b --topology=v5p:2x2x1 \
      --batch=128 --seq=4500 --microbatches=32 --remat=full

Needs libtpu installed: the dev install pins the libtpu that `pip install ".[tpu]"` puts on a TPU
VM with our jax (requirements-dev.txt), so the check compiles with the pod's compiler; the report
names the libtpu and jax versions it compiled with. No TPU and no parameter memory are used. The
last line is machine-readable:
  aot program=<p> preset=<p> topology=<t> per_chip_gib=<x> hbm_gib=<y> fits=<true|false> est_mfu=<z>
      libtpu=<version>
"""

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host runs nothing; libtpu compiles
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # not on a TPU VM: skip the metadata server
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no chip to lock

import importlib  # noqa: E402
import importlib.util  # noqa: E402

from empo2_jax.programs import aot  # noqa: E402
from empo2_jax import cli, compile_cache  # noqa: E402
from empo2_jax.train import settings  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Modules that register further programs (train_step: the EMPO2 update; sampler, sampler_prefill).
PROGRAM_MODULES = ("empo2_jax.programs.update_aot", "empo2_jax.programs.sampler_aot")
for _module in PROGRAM_MODULES:
  importlib.import_module(_module)


def base_config():
  """The base config (empo2_jax/defaults.py): the dtypes, remat, mesh, mini-batches and update
  settings training uses by default."""
  from empo2_jax import defaults

  return defaults.get_config()


def default_microbatches(c, program: str) -> int:
  """Gradient-accumulation steps of one mini-batch: optim.minibatch_size // optim.micro_rows for
  the programs that accumulate gradients (train_step, lm_train_step), else 1."""
  if program not in aot.MICROBATCHED:
    return 1
  return max(1, c.optim.minibatch_size // c.optim.micro_rows)


def main(argv=None) -> int:
  c = base_config()
  mesh = ",".join(f"{k}={v}" for k, v in c.mesh.items())
  microbatches = default_microbatches(c, "train_step")
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--program", required=True, help=f"one of {sorted(aot.PROGRAMS)}")
  p.add_argument("--preset", required=True, help="model preset, e.g. 0.5b, 7b, tiny")
  p.add_argument("--topology", required=True, help=f"e.g. {', '.join(aot.TOPOLOGY_EXAMPLES)}")
  p.add_argument("--batch", type=int, required=True, help="global batch (rows)")
  p.add_argument("--seq", type=int, required=True, help="tokens per row")
  # Defaults are the training defaults of configs/base.py, nothing else.
  p.add_argument("--mesh", default=mesh, help=f"default {mesh} (configs/base.py)")
  p.add_argument(
    "--remat",
    default=c.model.remat,
    help=f"none | full | dots_saveable; default {c.model.remat} (configs/base.py)",
  )
  p.add_argument(
    "--attention_impl",
    default=c.model.attention_impl,
    help=f"flash | dense; default {c.model.attention_impl} (configs/base.py)",
  )
  p.add_argument(
    "--param_dtype",
    default=c.model.param_dtype,
    help=f"weight storage; default {c.model.param_dtype} (configs/base.py)",
  )
  p.add_argument(
    "--compute_dtype",
    default=c.model.compute_dtype,
    help=f"matmul dtype; default {c.model.compute_dtype} (configs/base.py)",
  )
  p.add_argument(
    "--microbatches",
    type=int,
    default=None,
    help=f"gradient-accumulation steps of train_step / lm_train_step; default {microbatches} "
    "(optim.minibatch_size // optim.micro_rows of configs/base.py); 1 for the other programs",
  )
  p.add_argument("--loss_chunk", type=int, default=512, help="tokens per vocab-projection chunk")
  p.add_argument("--hbm_gib", type=float, default=None, help="override the chip's HBM (what-if)")
  p.add_argument(
    "--lora_rank",
    type=int,
    default=c.model.lora_rank,
    help="LoRA adapters of this rank, the base frozen (model/lora.py; --param_dtype=bfloat16 is "
    f"then allowed); default {c.model.lora_rank}: full fine-tuning (configs/base.py)",
  )
  p.add_argument("--lora_alpha", type=float, default=c.model.lora_alpha, help="LoRA's alpha")
  p.add_argument(
    "--lora_targets",
    default=c.model.lora_targets,
    help=f"peft module names or all-linear; default {c.model.lora_targets} (configs/base.py)",
  )
  p.add_argument(
    "--fuse_layer_grads",
    default="auto",
    choices=("auto", "on", "off"),
    help="train_step: add each layer's gradient into the accumulator in the backward "
    "(model/grad_accum.py); auto: wherever remat is full and layers are scanned",
  )
  p.add_argument(
    "--no_cost_probe",
    action="store_true",
    help="skip the flops/time probes (est_mfu=nan; memory figures only)",
  )
  a = p.parse_args(argv)
  compile_cache.apply(c.train.compilation_cache)  # JAX's persistent cache (compile_cache.py)
  req = aot.AotRequest(
    program=a.program,
    preset=a.preset,
    topology=a.topology,
    batch=a.batch,
    seq=a.seq,
    mesh=a.mesh,
    remat=a.remat,
    param_dtype=a.param_dtype,
    compute_dtype=a.compute_dtype,
    num_microbatches=(
      a.microbatches if a.microbatches is not None else default_microbatches(c, a.program)
    ),
    update=settings.update_config(c),  # train_step: mini-batches of optim.minibatch_size
    loss_chunk=a.loss_chunk,
    hbm_gib=a.hbm_gib,
    cost_probe=not a.no_cost_probe,
    attention_impl=a.attention_impl,
    fuse_layer_grads={"auto": None, "on": True, "off": False}[a.fuse_layer_grads],
    lora_rank=a.lora_rank,
    lora_alpha=a.lora_alpha,
    lora_targets=a.lora_targets,
  )
  try:
    report = aot.compile_program(req)
  except (ValueError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(aot.format_report(report, req), flush=True)
  return 0


if __name__ == "__main__":
  cli.guard(main)  # one-line errors for config and path mistakes (exit 2)
