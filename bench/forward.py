"""Forward throughput: our jitted forward vs transformers' torch forward, same weights.

  python bench/forward.py [--model smollm2|0.5b-shape] [--layers 0] [--batch 4] [--seq 256]

Model (bench/_models.py): SmolLM2-135M-Instruct's real weights by default, or Qwen2.5-0.5B shapes
with random init; --layers N keeps the first N layers (0: all). fp32 on both sides. Last line:
`forward_tokens_per_s ours=<x> hf=<y> ratio=<x/y>`.
"""

import argparse
import time

import numpy as np


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="smollm2")
  ap.add_argument("--layers", type=int, default=0)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--iters", type=int, default=3)
  args = ap.parse_args()

  import jax
  import torch
  from transformers import AutoModelForCausalLM

  from _models import bench_model
  from empo2_jax.model import qwen2

  config, params, tmp, vocab = bench_model(args.model, args.layers)
  tokens = np.random.default_rng(0).integers(0, vocab, (args.batch, args.seq)).astype(np.int32)
  mask = np.ones_like(tokens)
  n_tok = tokens.size

  fwd = jax.jit(qwen2.forward, static_argnums=1)
  fwd(params, config, tokens, mask).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(args.iters):
    fwd(params, config, tokens, mask).block_until_ready()
  ours = n_tok * args.iters / (time.perf_counter() - t0)

  model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
  tt = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    model(tt)
    t0 = time.perf_counter()
    for _ in range(args.iters):
      model(tt)
  ref = n_tok * args.iters / (time.perf_counter() - t0)
  print(
    f"model={args.model} layers={config.num_layers} batch={args.batch} seq={args.seq} fp32 "
    f"devices={jax.devices()[0].platform} torch_threads={torch.get_num_threads()}"
  )
  print(f"forward_tokens_per_s ours={ours:.1f} hf={ref:.1f} ratio={ours / ref:.3f}")


if __name__ == "__main__":
  main()
