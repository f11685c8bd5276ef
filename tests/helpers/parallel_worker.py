"""Subprocess body for the parallel tests (needs its own XLA device count, set before jax loads).

python tests/helpers/parallel_worker.py parity OUT.json                    # 8 devices, 4 meshes vs
1
python tests/helpers/parallel_worker.py run OUT.npz MESH                    # one process, 8 devices
python tests/helpers/parallel_worker.py run OUT.npz MESH ADDR NPROC PID     # one of NPROC processes
"""

import json
import os
import sys

if __name__ == "__main__":
  nproc = int(sys.argv[5]) if len(sys.argv) > 5 else 1
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // nproc}"
  os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

import jax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from empo2_jax.model import llama  # noqa: E402
from empo2_jax.model.configs import LlamaConfig  # noqa: E402
from empo2_jax.parallel import mesh as pmesh, sharding as shd  # noqa: E402
from empo2_jax.programs import train_lm  # noqa: E402

CONFIG = LlamaConfig(
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  tie_word_embeddings=False,
)
# eps well above gradient rounding, so the Adam step is smooth in the gradient (with eps
# 1e-8, g / (|g| + eps) turns 1e-9 rounding in near-zero gradients into lr-sized differences).
# 2 micro-batches of 8 rows; the projection in chunks of 7 of the 23 positions that predict a
# token (the last chunk padded) and of 100 vocabulary columns (512 = 5 x 100 + a tail of 12).
TRAIN = train_lm.LMTrainConfig(lr=1e-2, eps=1e-3, micro_rows=8, vocab_chunk=100, token_chunk=7)
MESHES = [(8, 1, 1), (1, 8, 1), (1, 4, 2), (2, 2, 2)]


def inputs():
  params = jax.tree.map(np.asarray, llama.init_params(CONFIG, jax.random.key(0)))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CONFIG.vocab_size, (16, 24)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[1, :5] = 0  # left padding
  mask[2, -4:] = 0  # right padding
  return params, tokens, mask


def run(mesh, params, tokens, mask, local_rows=None):
  """Sharded forward + one lm_train_step on `mesh`; returns host values (and the sharded state)."""
  if local_rows is None:
    batch = shd.shard_batch({"tokens": tokens, "attn": mask}, mesh)
  else:  # each process hands over only its own rows
    batch = shd.batch_from_process_local(
      {"tokens": tokens[local_rows], "attn": mask[local_rows]}, mesh
    )
  logits = train_lm.make_sharded_forward(CONFIG, mesh)(
    shd.shard_tree(params, mesh), batch["tokens"], batch["attn"]
  )
  state = train_lm.train_state_from_params(params, train_lm.make_optimizer(TRAIN), mesh)
  state, metrics = train_lm.make_lm_train_step(CONFIG, TRAIN, mesh=mesh)(state, batch)

  def host(x):
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return {
    "logits": host(logits),
    "loss": float(metrics["loss"]),
    "grad_norm": float(metrics["grad_norm"]),
    "params": [host(x) for x in jax.tree.leaves(state.params)],
  }, state


def max_diff(a, b):
  return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def parity(out_path):
  params, tokens, mask = inputs()
  ref, _ = run(pmesh.make_mesh((1, 1, 1), jax.devices()[:1]), params, tokens, mask)
  logits = np.asarray(llama.forward(params, CONFIG, tokens, mask))
  report = {
    "ref_vs_unsharded_forward": float(np.abs(ref["logits"] - logits).max()),
    "ref_loss": ref["loss"],
    "ref_params_moved": max_diff(ref["params"], jax.tree.leaves(params)),
  }
  for shape in MESHES:
    mesh = pmesh.make_mesh(shape)
    got, state = run(mesh, params, tokens, mask)
    report[str(shape)] = {
      "logits": float(np.abs(got["logits"] - ref["logits"]).max()),
      "loss": abs(got["loss"] - ref["loss"]),
      "grad_norm": abs(got["grad_norm"] - ref["grad_norm"]),
      "params": max_diff(got["params"], ref["params"]),
      "wq_shard": list(state.params["layers"]["wq"].addressable_shards[0].data.shape),
      "embed_shard": list(state.params["embed"].addressable_shards[0].data.shape),
      "mu_wq_shard": list(
        state.opt_state[1][0].mu["layers"]["wq"].addressable_shards[0].data.shape
      ),
    }
  with open(out_path, "w") as f:
    json.dump(report, f)


def one_run(out_path, mesh_spec, addr=None, nproc=1, pid=0):
  if addr:
    pmesh.initialize_distributed(addr, nproc, pid)
  params, tokens, mask = inputs()
  mesh = pmesh.make_mesh(mesh_spec)
  rows = None
  if nproc > 1:
    per = tokens.shape[0] // nproc
    rows = slice(pid * per, (pid + 1) * per)
  got, _ = run(mesh, params, tokens, mask, rows)
  if pid == 0:
    np.savez(
      out_path,
      *got["params"],
      logits=got["logits"],
      loss=got["loss"],
      devices=jax.device_count(),
      processes=jax.process_count(),
    )
  if addr:
    jax.distributed.shutdown()


if __name__ == "__main__":
  if sys.argv[1] == "parity":
    parity(sys.argv[2])
  else:
    extra = sys.argv[4:7]
    one_run(sys.argv[2], sys.argv[3], *(extra[:1] + [int(x) for x in extra[1:]]))
