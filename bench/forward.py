"""Forward throughput: our jitted forward vs transformers' torch forward, same weights.

  python bench/forward.py [--model smollm2|0.5b-shape] [--layers 0] [--batch 4] [--seq 256]

Model (bench/_common.py): SmolLM2-135M-Instruct's real weights by default, or Qwen2.5-0.5B shapes
with random init; --layers N keeps the first N layers (0: all). fp32 on both sides. Last line:
`forward_tokens_per_s ours=<x> hf=<y> ratio=<x/y>`.
"""

import numpy as np

from _common import bench_model, model_flags, parser, platform, result, seconds_per_call


def main():
  ap = parser(__doc__)
  model_flags(ap)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--iters", type=int, default=3)
  args = ap.parse_args()

  import jax
  import torch
  from transformers import AutoModelForCausalLM

  from empo2_jax.model import llama

  config, params, tmp, vocab = bench_model(args.model, args.layers)
  tokens = np.random.default_rng(0).integers(0, vocab, (args.batch, args.seq)).astype(np.int32)
  mask = np.ones_like(tokens)

  fwd = jax.jit(llama.forward, static_argnums=1)
  ours_s, _ = seconds_per_call(
    lambda: fwd(params, config, tokens, mask).block_until_ready(), args.iters
  )
  model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
  tt = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    hf_s, _ = seconds_per_call(lambda: model(tt), args.iters)

  print(
    f"model={args.model} layers={config.num_layers} batch={args.batch} seq={args.seq} fp32 "
    f"devices={platform()} torch_threads={torch.get_num_threads()}"
  )
  ours, ref = tokens.size / ours_s, tokens.size / hf_s
  result("forward_tokens_per_s", ours=ours, hf=ref, ratio=(ours / ref, ".3f"), fmt=".1f")


if __name__ == "__main__":
  main()
