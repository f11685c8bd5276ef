"""Chunked vs naive (full-logits) token log-probs: compiled temporary memory and time.

  python bench/logprobs.py [--vocab 151936] [--time 4096] [--hidden 128] [--chunk 8192] [--iters 2]

Measures the training use: value and gradient (w.r.t. hidden states and the output embedding) of
sum(logp) + sum(entropy), float32. Temporary memory is XLA's compiled `temp_size_in_bytes`. The
naive kernel is only timed when its temporaries fit in half of the machine's free memory.
Last line: `logprobs temp_mib chunked=<a> naive=<b> ratio=<b/a>`.
"""

import os

import numpy as np

from _common import parser, platform, result, seconds_per_call


def free_bytes():
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError):
    return 0


def main():
  ap = parser(__doc__)
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--time", type=int, default=4096)
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--chunk", type=int, default=8192)
  ap.add_argument("--iters", type=int, default=2)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp

  from empo2_jax.rl.logprobs import naive_token_logprobs, token_logprobs

  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(0, 1, (1, args.time, args.hidden)), jnp.float32)
  w = jnp.asarray(rng.normal(0, 0.05, (args.hidden, args.vocab)), jnp.float32)
  t = jnp.asarray(rng.integers(0, args.vocab, (1, args.time)), jnp.int32)

  def objective(fn):
    def f(h, w):
      lp, ent = fn(h, w, t, with_entropy=True)
      return jnp.sum(lp) + jnp.sum(ent)

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

  kernels = {
    "chunked": objective(lambda *a, **k: token_logprobs(*a, chunk_size=args.chunk, **k)),
    "naive": objective(naive_token_logprobs),
  }
  temp, secs, values = {}, {}, {}
  for name, f in kernels.items():
    compiled = f.lower(h, w).compile()
    temp[name] = compiled.memory_analysis().temp_size_in_bytes / 2**20
    if name == "naive" and temp[name] * 2**20 > 0.5 * free_bytes():
      print(f"{name}: temp {temp[name]:.0f} MiB does not fit half the free memory; not run")
      secs[name] = float("nan")
      continue
    secs[name], values[name] = seconds_per_call(
      lambda: jax.block_until_ready(compiled(h, w)), args.iters
    )
    print(f"{name}: temp {temp[name]:.1f} MiB, fwd+bwd {secs[name]:.3f} s")
  if len(values) == 2:
    (vc, (ghc, gwc)), (vn, (ghn, gwn)) = values["chunked"], values["naive"]
    err = max(float(jnp.max(jnp.abs(ghc - ghn))), float(jnp.max(jnp.abs(gwc - gwn))))
    print(
      f"value rel diff {abs(float(vc) - float(vn)) / abs(float(vn)):.2e}, "
      f"max grad abs diff {err:.2e}"
    )
  print(
    f"vocab={args.vocab} time={args.time} hidden={args.hidden} chunk={args.chunk} float32 "
    f"device={platform()} time_s chunked={secs['chunked']:.3f} "
    f"naive={secs['naive']:.3f}"
  )
  result("logprobs temp_mib", **temp, ratio=temp["naive"] / temp["chunked"], fmt=".1f")


if __name__ == "__main__":
  main()
