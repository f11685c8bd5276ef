"""Forward throughput: our jitted forward vs transformers' torch forward, same random model.

  python bench/forward.py [--layers 4] [--batch 4] [--seq 512] [--iters 5]

Model: Qwen2.5-0.5B shapes cut to --layers layers, fp32, random init (written once as a HF
checkpoint so both sides read identical weights). Last line:
`forward_tokens_per_s ours=<x> hf=<y> ratio=<x/y>`.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--iters", type=int, default=3)
  args = ap.parse_args()

  import jax
  import torch
  from transformers import Qwen2ForCausalLM

  from empo2_jax.model import configs, hf, qwen2

  config = configs.get_preset("0.5b", num_layers=args.layers)
  tmp = tempfile.mkdtemp(prefix="bench_fwd_")
  hf.save_checkpoint(tmp, config, qwen2.init_params(config, jax.random.PRNGKey(0)))
  config, params = hf.load_checkpoint(tmp)
  params = jax.device_put(params)
  tokens = np.random.default_rng(0).integers(0, 151643, (args.batch, args.seq)).astype(np.int32)
  mask = np.ones_like(tokens)
  n_tok = tokens.size

  fwd = jax.jit(qwen2.forward, static_argnums=1)
  fwd(params, config, tokens, mask).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(args.iters):
    fwd(params, config, tokens, mask).block_until_ready()
  ours = n_tok * args.iters / (time.perf_counter() - t0)

  model = Qwen2ForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32).eval()
  tt = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    model(tt)
    t0 = time.perf_counter()
    for _ in range(args.iters):
      model(tt)
  ref = n_tok * args.iters / (time.perf_counter() - t0)
  print(f"model=0.5b-shape layers={args.layers} batch={args.batch} seq={args.seq} fp32 "
        f"devices={jax.devices()[0].platform} torch_threads={torch.get_num_threads()}")
  print(f"forward_tokens_per_s ours={ours:.1f} hf={ref:.1f} ratio={ours / ref:.3f}")


if __name__ == "__main__":
  main()
