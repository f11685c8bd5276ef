"""How much of a TPU update step libtpu's cost model charges to attention (AOT, no TPU needed).

  python bench/aot_attention.py [--preset 7b] [--topology v5p:2x2x1] [--microbatches 16]

Runs `launch/aot.py`'s cost probe for the EMPO2 `train_step` (batch 128 x seq 4532, the default
precision and remat) twice: with the model's attention, and with attention replaced by a free
stand-in (the queries passed through: no scores, no softmax, no values). The second estimate is a
lower bound on the step time of ANY attention kernel under this cost model, a fused Pallas
flash/splash kernel included, so its MFU is the most such a kernel could show here. Both keep the
model flops of the real attention in the MFU numerator (the convention of launch/aot.py).
Last line:
  aot_attention est_s model=<s> free=<s> est_mfu model=<x> free=<y>
A probe that counts fewer flops than the program's matmuls must execute (a loop body counted
once) prints nan for that side; the probe flop counts are on the lines above.
"""

import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host runs nothing; libtpu compiles
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from _common import parser  # noqa: E402


def free_attention(q, k, v, allowed, dtype, block):
  """Attention's shape with none of its work: [B, T, H, hd] queries -> [B, T, H*hd]."""
  del k, v, allowed, dtype, block
  return q.reshape(q.shape[0], q.shape[1], -1)


def probe(req, config, mesh, devices) -> dict:
  from empo2_jax.programs import aot

  t0 = time.time()
  r = aot.cost_estimate(req, config, mesh, aot.PROGRAMS[req.program](config, mesh, req), devices)
  print(
    f"  probe flops {r['compiler_flops']:.3e} (floor {r['floor_flops']:.3e}, model "
    f"{r['model_flops']:.3e}), est {r['est_seconds']:.2f}s, mfu {r['est_mfu']:.3f}, "
    f"probe {time.time() - t0:.0f}s",
    flush=True,
  )
  return {"seconds": r["est_seconds"] if r["trusted"] else float("nan"), "mfu": r["est_mfu"]}


def main():
  ap = parser(__doc__)
  ap.add_argument("--preset", default="7b")
  ap.add_argument("--topology", default="v5p:2x2x1")
  ap.add_argument("--microbatches", type=int, default=16)
  ap.add_argument("--batch", type=int, default=128)
  ap.add_argument("--seq", type=int, default=4532)
  args = ap.parse_args()

  import empo2_jax.programs.update_aot  # noqa: F401  (registers "train_step")
  from empo2_jax import defaults
  from empo2_jax.model import llama
  from empo2_jax.model.configs import get_preset
  from empo2_jax.programs import aot
  from empo2_jax.parallel.mesh import make_mesh
  from empo2_jax.train import settings

  c = defaults.get_config()  # the paper config: mesh, remat, dtypes and the update's settings
  req = aot.AotRequest(
    program="train_step",
    preset=args.preset,
    topology=args.topology,
    batch=args.batch,
    seq=args.seq,
    num_microbatches=args.microbatches,
    mesh=",".join(f"{k}={v}" for k, v in c.mesh.items()),
    remat=c.model.remat,
    param_dtype=c.model.param_dtype,
    compute_dtype=c.model.compute_dtype,
    update=settings.update_config(c),
  )
  devices = aot.topology_devices(req.topology)
  config = get_preset(
    req.preset, remat=req.remat, param_dtype=req.param_dtype, compute_dtype=req.compute_dtype
  )
  mesh = make_mesh(req.mesh, devices)
  print(f"train_step {req.preset} on {req.topology}, micro-batches {req.num_microbatches}")
  print("model attention:", flush=True)
  real = probe(req, config, mesh, devices)
  model_attention = llama._attend_causal
  llama._attend_causal = free_attention
  try:
    print("free attention:", flush=True)
    free = probe(req, config, mesh, devices)
  finally:
    llama._attend_causal = model_attention
  print(
    f"aot_attention est_s model={real['seconds']:.2f} free={free['seconds']:.2f} "
    f"est_mfu model={real['mfu']:.3f} free={free['mfu']:.3f}"
  )


if __name__ == "__main__":
  main()
