"""Update-sized attention: forward+backward time and peak memory of the loss gradient, per
attention implementation (LlamaConfig.attention_impl) and remat policy.

  python bench/attention.py [--seq 2048] [--iters 1] [--settings dense:full:1024,flash:none,...]

Model: SmolLM2-135M shapes (30 layers, 9 query / 3 key-value heads of 64, vocabulary 49,152), fp32
params and compute as the CPU `learn` config trains it, random init (same flops and memory as the
checkpoint). Input: one packed row of --seq tokens (micro_rows=1, all real), the loss the update
differentiates in shape: the log-probs of --turns response spans of 32 tokens spread over the row
(rl/packing.packed_response_logprobs). Each setting runs in a fresh subprocess, so its peak RSS
(ru_maxrss: parameters, gradients, activations, XLA's buffers) is its own. One line per setting:

  attention impl=flash remat=none block=512 seq=2048 compile_s=... fwd_bwd_s=... cpu_s=...
    peak_rss_gib=...

fwd_bwd_s: wall seconds per call, mean of --iters calls after the compiling one; cpu_s: the
process's CPU seconds per call, the steadier figure on a machine shared with other jobs; block:
LlamaConfig.attention_block, the setting's third field or the config default. Benchmarks print;
they assert nothing.
"""

import json
import os
import resource
import subprocess
import sys
import time

from _common import parser, result

# impl:remat[:attention_block]; dense at 1024 is the path before flash existed
SETTINGS = "dense:full:1024,flash:none,flash:full,flash:dots_saveable"


def _cpu_s() -> float:
  """User + system CPU seconds of this process (all its threads) so far."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def child(impl: str, remat: str, seq: int, turns: int, iters: int, block: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from empo2_jax.model import configs, llama
  from empo2_jax.rl.packing import packed_response_logprobs

  kw = dict(attention_impl=impl, remat=remat, param_dtype="float32", compute_dtype="float32")
  if block >= 0:
    kw["attention_block"] = block
  config = configs.get_preset("smollm2-135m", **kw)
  params = llama.init_params(config, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, config.vocab_size, (1, seq)), jnp.int32)
  mask = jnp.ones((1, seq), jnp.int32)
  resp = 32
  starts = jnp.asarray(np.linspace(resp, seq - resp, turns).astype(np.int32)[None])  # [1, turns]

  def loss(p):
    logp = packed_response_logprobs(p, config, tokens, mask, starts, resp)  # [1, turns, 32]
    return -jnp.mean(logp)

  grad = jax.jit(jax.value_and_grad(loss))
  t0 = time.perf_counter()
  jax.block_until_ready(grad(params))
  compile_s = time.perf_counter() - t0
  t0, c0 = time.perf_counter(), _cpu_s()
  for _ in range(iters):
    value, g = jax.block_until_ready(grad(params))
  secs, cpu = (time.perf_counter() - t0) / iters, (_cpu_s() - c0) / iters
  gnorm = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g))))
  rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
  return dict(
    impl=impl,
    remat=remat,
    block=config.attention_block,
    compile_s=compile_s,
    fwd_bwd_s=secs,
    cpu_s=cpu,
    peak_rss_gib=rss_gib,
    loss=float(value),
    grad_norm=gnorm,
  )


def main():
  ap = parser(__doc__)
  ap.add_argument("--seq", type=int, default=2048, help="tokens in the packed row")
  ap.add_argument("--turns", type=int, default=10, help="response spans of 32 tokens scored")
  ap.add_argument("--iters", type=int, default=1, help="timed calls after the compiling one")
  ap.add_argument(
    "--settings", default=SETTINGS, help="impl:remat,... (remat: none|full|dots_saveable)"
  )
  ap.add_argument("--child", default="", help=argparse_hidden())
  a = ap.parse_args()
  if a.child:
    impl, remat, block = (a.child.split(":") + ["-1"])[:3]
    print(json.dumps(child(impl, remat, a.seq, a.turns, a.iters, int(block))), flush=True)
    return
  for setting in a.settings.split(","):
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={setting}"]
    cmd += [f"--seq={a.seq}", f"--turns={a.turns}", f"--iters={a.iters}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
      impl, remat = setting.split(":")[:2]
      tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
      result("attention", impl=impl, remat=remat, failed=f"rc={proc.returncode}", error=tail)
      continue
    r = json.loads(lines[-1])
    result(
      "attention",
      impl=r["impl"],
      remat=r["remat"],
      block=r["block"],
      seq=a.seq,
      compile_s=(r["compile_s"], ".1f"),
      fwd_bwd_s=(r["fwd_bwd_s"], ".2f"),
      cpu_s=(r["cpu_s"], ".2f"),
      peak_rss_gib=(r["peak_rss_gib"], ".2f"),
      loss=(r["loss"], ".5f"),
      grad_norm=(r["grad_norm"], ".5f"),
      flush=True,
    )


def argparse_hidden():
  import argparse

  return argparse.SUPPRESS


if __name__ == "__main__":
  main()
