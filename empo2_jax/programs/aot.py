"""Ahead-of-time compilation for TPU topologies from a CPU machine (libtpu, no TPU needed).

A program is lowered on abstract, sharded inputs (ShapeDtypeStructs: no param is allocated) over
the devices of `jax.experimental.topologies.get_topology_desc(name)` and compiled by libtpu. The
report gives per-chip memory (argument + output + temp - aliased), whether that fits the chip's
HBM, the compiler's flop count and estimated run time, and the implied model-flops utilisation.

XLA's cost analysis counts a while-loop body once, whatever its trip count, so the full program's
flops and time are not read off it directly. A cost probe compiles the same program for one
micro-batch, one loss chunk and 1 and 2 unrolled layers, without libtpu's windowed einsum (a loop
of its own; `PROBE_COMPILER_OPTIONS`); cost(L) = c1 + (L - 1)(c2 - c1), times the number of
micro-batches (the optimizer update, counted M times, is negligible).

The probe itself can still hide work in a loop (the update's micro-batch loop has a dynamic trip
count, and libtpu has other loop-forming passes). Each program therefore states
a floor: the matmul flops that any compilation of it must execute (every pass, the remat
recompute included, attention excluded). A probe that counts fewer flops than the floor undercounts,
and the report gives no time or MFU for it instead of a flattering one.

Programs live in `PROGRAMS` (name -> builder). A builder takes (model_config, mesh, request) and
returns `Program(fn, args, model_flops, floor_flops)`; the EMPO2 `train_step` and the
`sampler` programs register themselves this way:

    @register_program("train_step")
    def _build(config, mesh, req): ...
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from empo2_jax.model import llama
from empo2_jax.model.configs import LlamaConfig, get_preset
from empo2_jax.parallel import sharding as shd
from empo2_jax.parallel.mesh import make_mesh
from empo2_jax.programs.train_lm import (
  LMTrainConfig,
  abstract_train_state,
  make_lm_train_step,
  make_optimizer,
  make_sharded_forward,
)

GIB = 1024**3
# Per chip, from Google Cloud's TPU system-architecture pages.
HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}
PEAK_BF16_TFLOPS = {"v4": 275, "v5e": 197, "v5p": 459, "v6e": 918}
# How a TPU VM presents the chips of a generation whose chips have two TensorCores: v4 and v5p VMs
# run them as megacore devices (one JAX device a chip, both cores, the chip's whole HBM). libtpu
# describes v5p that way by default but v4 as one device a core; asked for "megacore", it
# describes the v4 slice a user gets (v4:2x2x1, a v4-8: 4 devices of 32 GiB).
CHIP_CONFIG = {"v4": "megacore"}
TOPOLOGY_EXAMPLES = (
  "v4:2x2x1",
  "v4:2x2x2",
  "v5e:2x2",
  "v5e:2x4",
  "v5p:2x2x1",
  "v5p:2x2x2",
  "v6e:2x2",
  "v6e:4x4",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AotRequest:
  """One compile. The training settings (mesh, remat, dtypes, micro-batches, the update's
  settings) have no defaults here: launch/aot.py takes them from the config it loads."""

  program: str
  preset: str
  topology: str
  batch: int
  seq: int
  mesh: str  # "data=1,fsdp=-1,tensor=1" (config.mesh)
  remat: str
  param_dtype: str
  compute_dtype: str
  num_microbatches: int  # gradient-accumulation steps (train_step: of one mini-batch)
  # train_step: the update's settings (rl/update.UpdateConfig; launch/aot.py passes
  # train/settings.update_config of its config); None for the other programs.
  update: Any = None
  # lm_train_step: positions per chunk of the vocabulary projection (LMTrainConfig.token_chunk).
  # loss_chunk == seq marks the cost probe's request (_probe_cost): then lm_train_step and
  # train_step project the whole vocabulary at once (loop-free), else in 8192-column chunks;
  # train_step reads it for nothing else.
  loss_chunk: int = 512
  hbm_gib: float | None = None  # override the chip table (what-if / tests)
  cost_probe: bool = True  # compile the two small probes for flops / time / MFU
  attention_impl: str = "flash"  # model.attention_impl (launch/aot.py passes the config's)
  # train_step: rl/update.make_update_fn's fuse_layer_grads (None: wherever the model allows it)
  fuse_layer_grads: bool | None = None
  # LoRA (model/lora.py; launch/aot.py passes the config's model.lora_*): 0 = full fine-tuning
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: str = "all-linear"


class Program(NamedTuple):
  fn: Any  # a jitted function
  args: tuple  # abstract, sharded arguments for fn.lower
  model_flops: float  # useful flops of one call (for MFU), whole mesh
  floor_flops: float = 0.0  # flops any compilation must execute, whole mesh (0: no check)


PROGRAMS: dict[str, Callable[[LlamaConfig, Any, AotRequest], Program]] = {}
# The programs that accumulate gradients over micro-batches (the others take num_microbatches=1).
MICROBATCHED: set[str] = set()


def register_program(name: str, *, microbatched: bool = False):
  def deco(builder):
    PROGRAMS[name] = builder
    if microbatched:
      MICROBATCHED.add(name)
    return builder

  return deco


def forward_flops_per_token(c: LlamaConfig, seq: int, attention: bool = True) -> float:
  """2 x matmul params + attention scores and values over the full T x T matrix (PaLM's MFU
  convention; the cache-free forward computes 1/2-3/4 of it, `LlamaConfig.attention_block`).
  attention=False: the matmuls only."""
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
  matmul = c.num_layers * layer + c.hidden_size * c.vocab_size
  return 2.0 * matmul + (4.0 * c.num_layers * seq * q if attention else 0.0)


def matmul_floor(c: LlamaConfig, tokens: int, head_tokens: int, forwards: int, grads: bool):
  """Matmul flops a program must execute: `forwards` forward-equivalents (a forward 1, a backward
  2) over `tokens` decoder tokens and `head_tokens` vocabulary projections; with gradients under
  remat "full", one more forward of the decoder layers but their down projections (the head is
  not rematerialised). The backward needs a layer's values but not its last output (the down
  projection's, added to the residual), so the recompute leaves that matmul out (JAX drops what
  the backward does not read): 7B at seq 4,500 counted 3.22e13 flops a layer and micro-batch
  against 3.36e13 for four whole passes, 3.11e13 without the recomputed down projection."""
  head = 2.0 * c.hidden_size * c.vocab_size
  layers = forward_flops_per_token(c, 0, attention=False) - head
  down = 2.0 * c.num_layers * c.hidden_size * c.intermediate_size
  recompute = layers - down if grads and c.remat == "full" else 0.0
  return layers * tokens * forwards + recompute * tokens + head * head_tokens * forwards


def trusted_estimate(compiler_flops: float, floor_flops: float, seconds: float) -> bool:
  """Whether the cost probe's time can be believed: a positive time from a probe that counted at
  least the flops the program must execute (a loop body counted once falls below the floor)."""
  return seconds > 0 and compiler_flops >= floor_flops


def _batch_args(mesh, req: AotRequest):
  sh = shd.batch_sharding(mesh)
  spec = jax.ShapeDtypeStruct((req.batch, req.seq), jnp.int32, sharding=sh)
  return spec, spec


@register_program("forward")
def _forward(config, mesh, req):
  params = shd.abstract_on_mesh(
    jax.eval_shape(lambda: llama.init_params(config, jax.random.key(0))), mesh
  )
  tokens, mask = _batch_args(mesh, req)
  tokens_n = req.batch * req.seq
  flops = forward_flops_per_token(config, req.seq) * tokens_n
  floor = matmul_floor(config, tokens_n, tokens_n, forwards=1, grads=False)
  return Program(make_sharded_forward(config, mesh), (params, tokens, mask), flops, floor)


@register_program("lm_train_step", microbatched=True)
def _lm_train_step(config, mesh, req):
  if req.batch % req.num_microbatches:
    raise ValueError(f"batch={req.batch} must be a multiple of microbatches={req.num_microbatches}")
  cfg = LMTrainConfig(micro_rows=req.batch // req.num_microbatches, token_chunk=req.loss_chunk)
  if req.loss_chunk == req.seq:  # the cost probe: the whole vocabulary in one chunk, loop-free
    cfg = dataclasses.replace(cfg, vocab_chunk=config.vocab_size)
  state = shd.abstract_on_mesh(abstract_train_state(config, make_optimizer(cfg)), mesh)
  tokens, attn = _batch_args(mesh, req)
  tokens_n = req.batch * req.seq
  flops = 3 * forward_flops_per_token(config, req.seq) * tokens_n
  return Program(
    make_lm_train_step(config, cfg, mesh=mesh),
    (state, {"tokens": tokens, "attn": attn}),
    flops,
    # the vocabulary projection runs for the positions that predict a token: seq - 1 a row
    matmul_floor(config, tokens_n, req.batch * (req.seq - 1), forwards=3, grads=True),
  )


def topology_devices(name: str) -> list:
  gen = name.split(":")[0]
  if ":" not in name or gen not in HBM_GIB:
    raise ValueError(
      f"unknown TPU topology {name!r}; give <generation>:<chips>, generation one "
      f"of {sorted(HBM_GIB)}, e.g. {', '.join(TOPOLOGY_EXAMPLES)}"
    )
  try:
    kw = {"chip_config_name": CHIP_CONFIG[gen]} if gen in CHIP_CONFIG else {}
    return list(topologies.get_topology_desc(name, "tpu", **kw).devices)
  except Exception as e:  # libtpu's message, e.g. a layout its host bounds cannot split
    raise ValueError(
      f"libtpu could not build topology {name!r} ({e}); valid examples: "
      f"{', '.join(TOPOLOGY_EXAMPLES)}"
    ) from e


_HBM_OOM = re.compile(r"RESOURCE_EXHAUSTED.*?memory required for [^(]*\(([0-9.]+)G\)", re.S)


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return dict(cost or {})


# libtpu flags for the probes only. Windowed einsum (collective matmul) turns an all-gather or
# reduce-scatter feeding a matmul into a loop of collective permutes and partial matmuls, whose
# body cost_analysis() counts once: with it the 14B lm_train_step probe counted 2.86e13 flops per
# device against a matmul floor of 3.09e13. Without it every matmul is counted whole, and the
# collectives are priced unoverlapped, which the cost model does anyway (overlap flags change
# nothing, docs/aot_table.md): the estimate can only err on the slow side.
PROBE_COMPILER_OPTIONS = {
  "xla_tpu_enable_windowed_einsum_for_all_gather": False,
  "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
}


def _probe_cost(req: AotRequest, config: LlamaConfig, mesh) -> tuple[float, float]:
  """(flops, estimated seconds) per device of the full program, from loop-free probes."""
  m = req.num_microbatches
  probe_req = dataclasses.replace(req, batch=req.batch // m, num_microbatches=1, loss_chunk=req.seq)
  costs = []
  for layers in (1, 2):
    probe_cfg = config.replace(num_layers=layers, scan_layers=False)
    prog = PROGRAMS[req.program](probe_cfg, mesh, probe_req)
    cost = _cost(prog.fn.lower(*prog.args).compile(compiler_options=PROBE_COMPILER_OPTIONS))
    costs.append((float(cost.get("flops", 0.0)), float(cost.get("optimal_seconds", 0.0))))
  (f1, s1), (f2, s2) = costs
  extra = config.num_layers - 1
  seconds = m * (s1 + extra * (s2 - s1))
  if min(s1, s2, seconds) <= 0:  # libtpu's time model returns negative times for some chips (v5e)
    seconds = float("nan")
  return m * (f1 + extra * (f2 - f1)), seconds


def cost_estimate(req: AotRequest, config: LlamaConfig, mesh, prog: Program, devices) -> dict:
  """The cost probe's figures for `prog` (built for `req`), whole mesh: compiler flops, estimated
  seconds and MFU; `trusted` is False (and est_mfu nan) when `trusted_estimate` rejects them."""
  flops_device, seconds = _probe_cost(req, config, mesh)
  flops = flops_device * len(devices)
  chips = len({tuple(d.coords) for d in devices})
  peak = PEAK_BF16_TFLOPS[req.topology.split(":")[0]] * 1e12 * chips
  trusted = trusted_estimate(flops, prog.floor_flops, seconds)
  return {
    "compiler_flops": flops,
    "model_flops": prog.model_flops,
    "floor_flops": prog.floor_flops,
    "est_seconds": seconds,
    "trusted": trusted,
    "est_mfu": prog.model_flops / (peak * seconds) if trusted else float("nan"),
  }


def libtpu_version() -> str:
  """The libtpu that compiles: the `libtpu` package's version (the one `pip install ".[tpu]"`
  puts on a TPU VM, pinned in the dev install too), or the file $TPU_LIBRARY_PATH names when it
  points elsewhere; "none" without libtpu."""
  try:
    import libtpu
  except ImportError:
    return os.environ.get("TPU_LIBRARY_PATH") or "none"
  path = os.environ.get("TPU_LIBRARY_PATH")
  if path and os.path.realpath(path) != os.path.realpath(libtpu.get_library_path()):
    return path
  return libtpu.__version__


def compile_program(req: AotRequest) -> dict:
  """Compile `req.program` for `req.topology` and return the figures of the report."""
  if req.program not in PROGRAMS:
    raise ValueError(f"unknown program {req.program!r}; registered: {sorted(PROGRAMS)}")
  devices = topology_devices(req.topology)
  gen = req.topology.split(":")[0]
  chips = len({tuple(d.coords) for d in devices})
  per_chip_devices = len(devices) // chips
  config = get_preset(
    req.preset,
    remat=req.remat,
    param_dtype=req.param_dtype,
    compute_dtype=req.compute_dtype,
    attention_impl=req.attention_impl,
    lora_rank=req.lora_rank,
    lora_alpha=req.lora_alpha,
    lora_targets=req.lora_targets,
  )
  mesh = make_mesh(req.mesh, devices)
  prog = PROGRAMS[req.program](config, mesh, req)

  hbm = req.hbm_gib if req.hbm_gib is not None else HBM_GIB[gen]
  t0 = time.time()
  try:
    compiled = prog.fn.lower(*prog.args).compile()
  except jax.errors.JaxRuntimeError as e:
    oom = _HBM_OOM.search(str(e))
    if not oom:
      raise
    # libtpu refuses programs that overflow HBM; its figure is a lower bound on the need.
    need = float(oom.group(1)) * per_chip_devices
    return {
      "program": req.program,
      "preset": req.preset,
      "topology": req.topology,
      "libtpu": libtpu_version(),
      "jax": jax.__version__,
      "mesh": dict(mesh.shape),
      "chips": chips,
      "devices": len(devices),
      "params_b": config.num_params() / 1e9,
      "compile_s": time.time() - t0,
      "oom": str(e).splitlines()[0],
      "per_chip_gib": need,
      "hbm_gib": hbm,
      "fits": False,
      "est_mfu": float("nan"),
    }
  compile_s = time.time() - t0
  if req.cost_probe:
    cost = cost_estimate(req, config, mesh, prog, devices)
  else:
    cost = {"compiler_flops": 0.0, "model_flops": prog.model_flops, "est_seconds": 0.0}
    cost.update(floor_flops=prog.floor_flops, trusted=False, est_mfu=float("nan"))
  mem = compiled.memory_analysis()
  per_device = (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    + mem.temp_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.generated_code_size_in_bytes
  )
  per_chip_gib = per_device * per_chip_devices / GIB
  return {
    "program": req.program,
    "preset": req.preset,
    "topology": req.topology,
    "libtpu": libtpu_version(),
    "jax": jax.__version__,
    "mesh": dict(mesh.shape),
    "chips": chips,
    "devices": len(devices),
    "params_b": config.num_params() / 1e9,
    "compile_s": compile_s,
    "argument_gib": mem.argument_size_in_bytes / GIB,
    "output_gib": mem.output_size_in_bytes / GIB,
    "temp_gib": mem.temp_size_in_bytes / GIB,
    "alias_gib": mem.alias_size_in_bytes / GIB,
    "per_chip_gib": per_chip_gib,
    "hbm_gib": hbm,
    "fits": per_chip_gib <= hbm,
    **cost,
  }


def _last_line(r: dict) -> str:
  return (
    f"aot program={r['program']} preset={r['preset']} topology={r['topology']} "
    f"per_chip_gib={r['per_chip_gib']:.2f} hbm_gib={r['hbm_gib']:g} "
    f"fits={'true' if r['fits'] else 'false'} est_mfu={r['est_mfu']:.3f} libtpu={r['libtpu']}"
  )


def _time_phrase(r: dict) -> str:
  if r["trusted"]:
    return f"estimated {r['est_seconds']:.3f}s per call"
  if not r["est_seconds"] > 0:  # also nan
    return "no time estimate (libtpu's cost model gave a time <= 0)"
  return (
    f"no time estimate: the probe counted fewer flops than the program's matmuls need "
    f"({r['floor_flops']:.3e}), so a loop body was counted once (libtpu printed "
    f"{r['est_seconds']:.3f}s); try another --microbatches"
  )


def format_report(r: dict, req: AotRequest) -> str:
  head = (
    f"program {r['program']}  preset {r['preset']} ({r['params_b']:.2f}B params)  topology "
    f"{r['topology']}: {r['chips']} chips, {r['devices']} devices, mesh {r['mesh']}\n"
    f"compiler: libtpu {r['libtpu']} with jax {r['jax']}"
  )
  if req.lora_rank:
    head += f"\nLoRA rank {req.lora_rank} on {req.lora_targets}: the base frozen, adapters trained"
  if "oom" in r:
    return "\n".join(
      [
        head,
        f"libtpu: {r['oom']}",
        f"per chip: at least {r['per_chip_gib']:.2f} GiB of {r['hbm_gib']} GiB HBM -> DOES NOT FIT",
        _last_line(r),
      ]
    )
  lines = [
    head,
    f"batch {req.batch} x seq {req.seq}, micro-batches {req.num_microbatches}, remat "
    f"{req.remat}, params {req.param_dtype}, compute {req.compute_dtype}; compiled in "
    f"{r['compile_s']:.1f}s",
    f"per device: arguments {r['argument_gib']:.3f} GiB, outputs {r['output_gib']:.3f} GiB, "
    f"temp {r['temp_gib']:.3f} GiB, aliased {r['alias_gib']:.3f} GiB",
    f"per chip: {r['per_chip_gib']:.3f} GiB of {r['hbm_gib']} GiB HBM -> "
    f"{'fits' if r['fits'] else 'DOES NOT FIT'}",
    (
      f"compiler flops {r['compiler_flops']:.3e} (model flops {r['model_flops']:.3e}, "
      f"matmul floor {r['floor_flops']:.3e}), " + _time_phrase(r)
      if req.cost_probe
      else f"cost probe off: no compiler flops / time (model flops {r['model_flops']:.3e})"
    ),
    _last_line(r),
  ]
  return "\n".join(lines)
