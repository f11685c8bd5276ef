"""Multi-turn sampling on the EMPO2 workload shape: session with prefix reuse vs re-prefill vs HF.

  python bench/sampler.py [--model smollm2|0.5b-shape] [--layers 0] [--rows 8] [--prompt 1000]
                          [--growth 150] [--new 32] [--turns 10] [--cache-dtype float32] [--skip-hf]

Model (bench/_common.py): SmolLM2-135M-Instruct's real weights by default, or Qwen2.5-0.5B shapes
with random init; --layers N keeps the first N layers (0: all); fp32 params and compute, identical
weights on both sides. Workload: --rows episodes whose
first prompt has ~--prompt tokens; each turn appends the --new sampled tokens plus a random user
message so the chat grows by ~--growth tokens; temperature 1, no top-k/top-p, no stop ids (every
turn generates exactly --new tokens on every side).
  (a) Session (prefix reuse): prefills only each turn's new suffix.
  (b) Session(reuse_prefix=False): re-prefills the full chat every turn.
  (c) transformers generate (torch, left-padded batch, do_sample=True, top_k=0).
Each side first runs one untimed turn-0/turn-1 pair to compile/warm up; timings cover --turns turns.
turns/s counts row-turns (actions produced) per second; tokens/s counts generated tokens.
Last line: `sampler turns_per_s ours=<a> reprefill=<b> hf=<c> ratio_vs_hf=<a/c>`.
"""

import time

import numpy as np

from _common import bench_model, model_flags, parser, platform, result


def workload(rng, args, vocab):
  """Turn 0 prompts and the user messages appended after each turn (fixed ahead of time)."""
  first = [
    rng.integers(0, vocab, args.prompt + int(rng.integers(-50, 51))).tolist()
    for _ in range(args.rows)
  ]
  user = [
    [
      rng.integers(0, vocab, max(1, args.growth - args.new + int(rng.integers(-30, 31)))).tolist()
      for _ in range(args.rows)
    ]
    for _ in range(args.turns)
  ]
  return first, user


def run_session(sess, first, user, turns, new, rng_seed):
  import jax

  hist = [list(p) for p in first]
  t0 = time.perf_counter()
  for t in range(turns):
    out = sess.step(
      dict(enumerate(hist)), max_new_tokens=new, temperature=1.0, rng=jax.random.key(rng_seed + t)
    )
    for r in range(len(hist)):
      hist[r] = hist[r] + out[r][0].tolist() + user[t][r]
  return time.perf_counter() - t0, hist


def run_hf(model, first, user, turns, new):
  import torch

  hist = [list(p) for p in first]
  t0 = time.perf_counter()
  for t in range(turns):
    width = max(len(h) for h in hist)
    ids = torch.zeros((len(hist), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, h in enumerate(hist):
      ids[r, width - len(h) :] = torch.tensor(h)
      mask[r, width - len(h) :] = 1
    with torch.no_grad():
      out = model.generate(
        ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new,
        min_new_tokens=new,
        pad_token_id=0,
      )
    for r in range(len(hist)):
      hist[r] = hist[r] + out[r, width:].tolist() + user[t][r]
  return time.perf_counter() - t0


def main():
  ap = parser(__doc__)
  model_flags(ap)
  ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--prompt", type=int, default=1000)
  ap.add_argument("--growth", type=int, default=150)
  ap.add_argument("--new", type=int, default=32)
  ap.add_argument("--turns", type=int, default=10)
  ap.add_argument("--cache-dtype", default="float32")
  ap.add_argument("--skip-hf", action="store_true")
  args = ap.parse_args()

  import torch
  from transformers import AutoModelForCausalLM

  from empo2_jax.sampling.sampler import SamplerSettings
  from empo2_jax.sampling.session import Session

  config, params, tmp, vocab = bench_model(args.model, args.layers)
  first, user = workload(np.random.default_rng(0), args, vocab)
  max_tokens = max(len(p) for p in first) + args.turns * (args.growth + 40) + args.new
  settings = SamplerSettings(cache_dtype=args.cache_dtype)
  print(
    f"model={args.model} layers={config.num_layers} fp32 cache={args.cache_dtype} rows={args.rows} "
    f"prompt~{args.prompt} growth~{args.growth} new={args.new} turns={args.turns} "
    f"max_tokens={max_tokens} devices={platform()} "
    f"torch_threads={torch.get_num_threads()}"
  )

  results, prefill = {}, {}
  for name, reuse in (("ours", True), ("reprefill", False)):
    warm = Session(
      params,
      config,
      num_rows=args.rows,
      max_tokens=max_tokens,
      settings=settings,
      reuse_prefix=reuse,
    )
    t0 = time.perf_counter()
    run_session(warm, first, user, min(2, args.turns), args.new, 999)
    warm_s = time.perf_counter() - t0
    sess = Session(
      params,
      config,
      num_rows=args.rows,
      max_tokens=max_tokens,
      settings=settings,
      reuse_prefix=reuse,
      engine=warm.engine,
    )
    secs, _ = run_session(sess, first, user, args.turns, args.new, 0)
    results[name] = secs
    prefill[name] = sess.stats
    per_ep = sess.stats["prefill_tokens"] / args.rows
    print(
      f"{name:10s} {secs:8.2f}s  tokens/s={args.rows * args.turns * args.new / secs:8.1f}  "
      f"turns/s={args.rows * args.turns / secs:7.3f}  prefill_tokens/episode={per_ep:9.0f} "
      f"(computed incl. padding {sess.stats['prefill_computed'] / args.rows:9.0f})  "
      f"warmup {warm_s:.1f}s  compiles={dict(warm.engine.traces)}"
    )

  if args.skip_hf:
    results["hf"] = float("nan")
  else:
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    run_hf(model, first, user, 1, args.new)
    secs = run_hf(model, first, user, args.turns, args.new)
    results["hf"] = secs
    print(
      f"{'hf':10s} {secs:8.2f}s  tokens/s={args.rows * args.turns * args.new / secs:8.1f}  "
      f"turns/s={args.rows * args.turns / secs:7.3f}  (re-reads the full chat every turn)"
    )

  tps = {k: args.rows * args.turns / v for k, v in results.items()}
  result("sampler turns_per_s", **tps, ratio_vs_hf=tps["ours"] / tps["hf"])


if __name__ == "__main__":
  main()
