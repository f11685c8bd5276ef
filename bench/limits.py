"""This machine's limits, the ceilings the other benches' figures are read against.

  .venv/bin/python bench/limits.py [--n 4096] [--mib 512] [--iters 5]

matmul: a jitted fp32 [n, n] @ [n, n] jnp.dot (2 n^3 flops), GFLOP/s of the best of `iters` calls
after a warm-up. membw: a jitted x + 1 over a `mib` MiB fp32 array, in place (donated: a read and a
write per element), GB/s (1e9 bytes, read + write) of the best call. On a shared machine both are
what was free at the time; the best of several calls approaches the idle figure.
Then `limits_shape matmul= m= k= n= gflops= frac_of_square=` for the matmuls of the SmolLM2 update
(bench/update.py: 1,152-token packed rows, hidden 576, MLP 1,536, 3 KV heads x 64, vocabulary
49,152 for ~256 response positions; the backward's weight gradients contract over the tokens):
what the probe's square matmul promises at these shapes, and at the shapes of the projections that
share an input fused (q/k/v, gate/up); then a decode step's products for 1 and 8 rows, where
weight_gbs (the [k, n] fp32 weights' bytes over the product's time) says how near a pass over the
weights the product runs. read: a jitted sum over a `mib` MiB array, bytes read per second (a
decode step's ceiling: it only reads). Last line: `limits matmul_gflops=<x> membw_gbs=<y>
read_gbs=<z>`.
"""

from _common import matmul_gflops, membw_gbs, parser, platform, read_gbs, result

# (name, m, k, n) of an [m, k] @ [k, n] product in the SmolLM2-135M update at learn,wide sizes
MODEL_SHAPES = (
  ("q_or_o_proj", 1152, 576, 576),
  ("kv_proj", 1152, 576, 192),
  ("mlp_up", 1152, 576, 1536),
  ("mlp_down", 1152, 1536, 576),
  ("mlp_up_weight_grad", 576, 1152, 1536),
  ("lm_head", 256, 576, 49152),
  # the same products with the projections that share an input fused into one (q, k and v:
  # 576 + 2 x 192 columns; gate and up: 2 x 1,536): what concatenated weights would run at
  ("qkv_fused", 1152, 576, 960),
  ("mlp_gate_up_fused", 1152, 576, 3072),
  # a decode step's products (bench/sampler.py): one token for each of 1 or 8 rows; with so few
  # rows a product is a pass over its weights, so weight_gbs (the weight bytes over the time) is
  # the figure to hold against membw_gbs
  ("decode_mlp_up_1row", 1, 576, 1536),
  ("decode_mlp_up_8rows", 8, 576, 1536),
  ("decode_lm_head_1row", 1, 576, 49152),
  ("decode_lm_head_8rows", 8, 576, 49152),
)


def main():
  ap = parser(__doc__)
  ap.add_argument("--n", type=int, default=4096, help="matmul size")
  ap.add_argument("--mib", type=int, default=512, help="array size of the bandwidth probe")
  ap.add_argument("--iters", type=int, default=5, help="timed calls (best taken)")
  args = ap.parse_args()
  print(f"platform={platform()}", flush=True)
  mm = matmul_gflops(args.n, args.iters)
  bw = membw_gbs(args.mib, args.iters)
  for name, m, k, n in MODEL_SHAPES:
    g = matmul_gflops(iters=args.iters, shape=(m, k, n))
    weight_gbs = 2.0 * g / m  # the fp32 [k, n] weights' 4 k n bytes over the 2 m k n flops' time
    result(
      "limits_shape",
      matmul=name,
      m=m,
      k=k,
      n=n,
      gflops=(g, ".1f"),
      frac_of_square=(g / mm, ".2f"),
      weight_gbs=(weight_gbs, ".1f"),
    )
  rd = read_gbs(args.mib, args.iters)
  result("limits", matmul_gflops=(mm, ".1f"), membw_gbs=(bw, ".2f"), read_gbs=(rd, ".2f"))


if __name__ == "__main__":
  main()
