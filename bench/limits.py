"""This machine's limits, the ceilings the other benches' figures are read against.

  .venv/bin/python bench/limits.py [--n 4096] [--mib 512] [--iters 5]

matmul: a jitted fp32 [n, n] @ [n, n] jnp.dot (2 n^3 flops), GFLOP/s of the best of `iters` calls
after a warm-up. membw: a jitted x + 1 over a `mib` MiB fp32 array, in place (donated: a read and a
write per element), GB/s (1e9 bytes, read + write) of the best call. On a shared machine both are
what was free at the time; the best of several calls approaches the idle figure.
Last line: `limits matmul_gflops=<x> membw_gbs=<y>`.
"""

from _common import matmul_gflops, membw_gbs, parser, platform, result


def main():
  ap = parser(__doc__)
  ap.add_argument("--n", type=int, default=4096, help="matmul size")
  ap.add_argument("--mib", type=int, default=512, help="array size of the bandwidth probe")
  ap.add_argument("--iters", type=int, default=5, help="timed calls (best taken)")
  args = ap.parse_args()
  print(f"platform={platform()}", flush=True)
  mm = matmul_gflops(args.n, args.iters)
  bw = membw_gbs(args.mib, args.iters)
  result("limits", matmul_gflops=(mm, ".1f"), membw_gbs=(bw, ".2f"))


if __name__ == "__main__":
  main()
