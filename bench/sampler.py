"""Multi-turn sampling on the EMPO2 workload shape: session with prefix reuse vs re-prefill vs HF,
and where the session's time goes against this machine's limits.

  python bench/sampler.py [--model smollm2|0.5b-shape] [--layers 0] [--rows 8] [--prompt 1000]
                          [--growth 150] [--new 32] [--turns 10] [--cache-dtype float32]
                          [--warmup-turns 0] [--decode-kernels auto|cpu|xla] [--skip-reprefill]
                          [--skip-hf] [--profile DIR]

Model (bench/_common.py): SmolLM2-135M-Instruct's real weights by default, or Qwen2.5-0.5B shapes
with random init; --layers N keeps the first N layers (0: all); fp32 params and compute, identical
weights on both sides. Workload: --rows episodes whose
first prompt has ~--prompt tokens; each turn appends the --new sampled tokens plus a random user
message so the chat grows by ~--growth tokens; temperature 1, no top-k/top-p, no stop ids (every
turn generates exactly --new tokens on every side).
  (a) Session (prefix reuse): prefills only each turn's new suffix.
  (b) Session(reuse_prefix=False): re-prefills the full chat every turn.
  (c) transformers generate (torch, left-padded batch, do_sample=True, top_k=0).
Each of our sides first runs the whole workload once untimed (--warmup-turns, default all: every
prefill chunk and row-count shape the timed turns use is compiled then; `compiles_timed=` on the
side's line counts programs compiled inside the timed turns, 0 when the warm-up covered them), as
a training run's later iterations reuse its first's programs; `warmup` gives the untimed run's
seconds, compiles included. transformers compiles nothing and warms up on one turn. Timings cover
--turns turns.
turns/s counts row-turns (actions produced) per second; tokens/s counts generated tokens.

Where the time goes (side (a)): first this machine's limits are probed in the same process
(bench/limits.py's matmul_gflops, membw_gbs and read_gbs; on a shared machine, what was free
then). The sampler Session's engine is wrapped so that each prefill is timed to completion and
each decode call separately; then
  `sampler_prefill s= tokens= computed= gflop= gflops_per_s= frac_of_matmul=`: tokens are the real
    new tokens prefilled, computed includes the padding of the chunks; gflop counts the matmuls the
    real tokens need: 2 x the decoder's linear weights per token + causal attention (2 x 2 x heads
    x head_dim x the token's context, per layer). The embedding is a lookup; no logits in prefill.
  `sampler_decode s= steps= ms_per_step= mb_per_step= gbs= frac_of_membw=`: a step samples one
    token for every row (the first of a turn from the prefill's last hidden state, the others
    after a forward of the previous token), so steps = turns x --new. mb_per_step is what a step
    must read: the weights once (decoder layers, final norm, output embedding) plus each active
    row's filled KV cache (layers x 2 x kv heads x head_dim x cache dtype bytes per token),
    averaged over the steps; gbs = those bytes / the step's seconds, frac_of_membw = gbs over the
    probe (which counts read + written bytes: on a 2-core VM it measured ~41 GB/s where a pure
    read ran at ~22), frac_of_read = gbs over a pure read's rate (_common.read_gbs, a sum over
    512 MiB: what a step that only reads can approach). dots_ms is the step's weight products
    alone at --rows rows, run as the sampler runs them (the CPU decode kernels where
    LlamaConfig.decode_kernels picks them; `decode_dots_ms`, timed in the same process);
    frac_of_dots = dots_ms / ms_per_step.
With --profile DIR, one more turn runs with its prefill and its decode call each under
jax.profiler.trace (DIR/prefill, DIR/decode: Perfetto traces) and `sampler_profile phase= op= s=
calls=` lines give each phase's heaviest XLA op kinds by exclusive time
(bench/_common.trace_breakdown), then `sampler_profile_op phase= op= s= calls= programs= shape=
source=` its heaviest single ops, each with the result shape and the JAX source op read off the
compiled HLO.
Where libtpu is installed on a machine without a TPU, run --profile with JAX_PLATFORMS=cpu:
jax.profiler otherwise crashes in libtpu's profiler plugin.
Last line: `sampler turns_per_s ours=<a> reprefill=<b> hf=<c> ratio_vs_hf=<a/c>`.
"""

import collections
import dataclasses
import re
import time

import numpy as np

from _common import (
  _exclusive_by_op,
  bench_model,
  matmul_gflops,
  membw_gbs,
  read_gbs,
  model_flags,
  parser,
  platform,
  result,
  trace_breakdown,
)


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


# -- where the time goes ---------------------------------------------------------------------------
class EngineTimer:
  """Wraps an Engine's prefill and decode (instance attributes shadow the methods) to time each
  call to completion and count the work it had to do (the module docstring says how)."""

  def __init__(self, engine, config, params, cache_dtype: str):
    import jax
    import jax.numpy as jnp

    self.engine, self.totals = engine, collections.Counter()
    c = config
    self.linear = sum(  # decoder weights a token multiplies (norms and biases are not matmuls)
      int(np.prod(v.shape)) for k, v in params["layers"].items() if k.startswith("w")
    )
    self.attn_per_ctx = 2.0 * 2.0 * c.num_layers * c.num_heads * c.head_dim
    out_emb = c.hidden_size * c.vocab_size
    leaves = jax.tree.leaves(params["layers"]) + [params["final_norm"]]
    self.weight_bytes = (
      sum(x.nbytes for x in leaves) + out_emb * params["final_norm"].dtype.itemsize
    )
    self.kv_token_bytes = (
      c.num_layers * 2 * c.num_kv_heads * c.head_dim * jnp.dtype(cache_dtype).itemsize
    )
    self.trace_dir = ""
    self._prefill, self._decode = engine.prefill, engine.decode
    engine.prefill, engine.decode = self.prefill, self.decode

  def traced(self, phase: str):
    """A profiler trace into trace_dir/phase while tracing is on, else nothing."""
    import contextlib
    import os

    import jax

    if not self.trace_dir:
      return contextlib.nullcontext()
    return jax.profiler.trace(os.path.join(self.trace_dir, phase), create_perfetto_trace=True)

  def prefill(self, params, cache, hidden, suffixes, start):
    import jax

    t0 = time.perf_counter()
    with self.traced("prefill"):
      cache, hidden, computed = self._prefill(params, cache, hidden, suffixes, start)
      jax.block_until_ready((cache, hidden))
    self.totals["prefill_s"] += time.perf_counter() - t0
    lens = np.array([len(x) if x is not None else 0 for x in suffixes], np.float64)
    start = np.asarray(start, np.float64)
    ctx = ((start + 1) + (start + lens)) / 2 * lens  # sum over new tokens of their context
    self.totals["prefill_tokens"] += lens.sum()
    self.totals["prefill_computed"] += computed
    self.totals["prefill_flop"] += 2.0 * self.linear * lens.sum() + self.attn_per_ctx * ctx.sum()
    return cache, hidden, computed

  def decode(self, params, cache, hidden, length, active, keys, **kw):

    t0 = time.perf_counter()
    with self.traced("decode"):
      out = self._decode(params, cache, hidden, length, active, keys, **kw)
    self.totals["decode_s"] += time.perf_counter() - t0
    steps = int(out[3].max(initial=0))
    filled = np.asarray(length, np.float64)[np.asarray(active, bool)]
    kv = (filled.sum() + len(filled) * (steps - 1) / 2) * self.kv_token_bytes  # mean over steps
    self.totals["decode_steps"] += steps
    self.totals["decode_bytes"] += steps * (self.weight_bytes + kv)
    return out

  def report(self, mm_gflops: float, bw_gbs: float, read_gbs: float, dots_ms: float):
    t = self.totals
    gfs = t["prefill_flop"] / 1e9 / t["prefill_s"]
    result(
      "sampler_prefill",
      s=(t["prefill_s"], ".2f"),
      tokens=int(t["prefill_tokens"]),
      computed=int(t["prefill_computed"]),
      gflop=(t["prefill_flop"] / 1e9, ".0f"),
      gflops_per_s=(gfs, ".1f"),
      frac_of_matmul=(gfs / mm_gflops, ".3f"),
      flush=True,
    )
    steps = t["decode_steps"]
    gbs = t["decode_bytes"] / 1e9 / t["decode_s"]
    result(
      "sampler_decode",
      s=(t["decode_s"], ".2f"),
      steps=int(steps),
      ms_per_step=(1e3 * t["decode_s"] / steps, ".1f"),
      mb_per_step=(t["decode_bytes"] / steps / 1e6, ".0f"),
      gbs=(gbs, ".2f"),
      frac_of_membw=(gbs / bw_gbs, ".3f"),
      frac_of_read=(gbs / read_gbs, ".3f"),
      dots_ms=(dots_ms, ".1f"),
      frac_of_dots=(dots_ms / (1e3 * t["decode_s"] / steps), ".3f"),
      flush=True,
    )


def decode_dots_ms(params, config, rows: int, iters: int = 5) -> float:
  """The decode step's weight products alone: every layer's seven projections (four calls: q/k/v
  and gate/up share theirs) and the output embedding for a [rows, hidden] input, with the step's
  data dependencies and nothing else (no attention, norms or sampling), each layer's weights a
  separate array and multiplied as the sampler does (by the CPU decode kernels over transposed
  copies where the config picks them); ms of the best of `iters` calls after a warm-up. At a few
  rows these products run far below the
  square matmul probe's rate and are the step's compute floor."""
  import jax
  import jax.numpy as jnp

  from _common import _best_seconds
  from empo2_jax.model import cpu_kernels, llama

  kernels = llama.decode_kernels(config)
  prepared = llama.split_layers(params)
  if kernels:
    prepared = llama.with_transposed(prepared, config)

  @jax.jit
  def step(x, prepared):
    def mm(x, w, key):  # x @ each weight of llama.TRANSPOSED[key], as decoder_layer does
      names = llama.TRANSPOSED[key]
      if kernels:
        return cpu_kernels.products(x, [w[n] for n in names], w[key])
      return [x @ w[n] for n in names]

    for w in prepared["layers"]:
      q, k, v = mm(x, w, "wqkv_t")
      a = q + jnp.tile(k + v, (1, q.shape[1] // k.shape[1]))  # stands in for attention's output
      x = x + mm(a, w, "wo_t")[0]
      gate, up = mm(x, w, "w_gate_up_t")
      x = x + mm(gate * up, w, "w_down_t")[0]
    return llama.logits(prepared, config, x, kernels=kernels)

  x = jnp.ones((rows, config.hidden_size), jnp.float32)
  prepared = jax.device_put(prepared)
  return 1e3 * _best_seconds(lambda: step(x, prepared).block_until_ready(), iters)


_META = re.compile(r'metadata=\{[^}]*op_name="([^"]*)"')


def profile_ops(phase: str, trace_dir: str, hlo_texts: list[str], top: int = 10):
  """Print the traced phase's heaviest op kinds, then its heaviest single ops with their shape and
  JAX source op (from the compiled HLO's metadata; where the phase ran several programs, from the
  first that has an op of that name: `programs` says in how many it occurs)."""
  for kind, op_s, n in trace_breakdown(trace_dir):
    result("sampler_profile", phase=phase, op=kind, s=(op_s, ".3f"), calls=n, flush=True)
  lines = collections.defaultdict(list)
  for text in hlo_texts:
    for line in text.splitlines():
      m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+)", line)
      if m and (not lines[m.group(1)] or lines[m.group(1)][-1][2] is not text):
        lines[m.group(1)].append((m.group(2), line, text))
  secs, calls = _exclusive_by_op(trace_dir)
  for name, s in secs.most_common(top):
    shape, line, _ = (lines.get(name) or [("?", "", None)])[0]
    meta = _META.search(line)
    src = meta.group(1).split("/")[-3:] if meta else ["?"]
    result(
      "sampler_profile_op",
      phase=phase,
      op=name,
      s=(s, ".3f"),
      programs=len(lines.get(name, ())),
      calls=calls[name],
      shape=shape,
      source="/".join(src),
      flush=True,
    )


def main():
  ap = parser(__doc__)
  model_flags(ap)
  ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--prompt", type=int, default=1000)
  ap.add_argument("--growth", type=int, default=150)
  ap.add_argument("--new", type=int, default=32)
  ap.add_argument("--turns", type=int, default=10)
  ap.add_argument("--cache-dtype", default="float32")
  ap.add_argument(
    "--warmup-turns", type=int, default=0, help="untimed turns first on our sides (0: --turns)"
  )
  ap.add_argument(
    "--decode-kernels",
    default="auto",
    choices=("auto", "cpu", "xla"),
    help="LlamaConfig.decode_kernels of our sides (xla: without the CPU decode kernels)",
  )
  ap.add_argument("--skip-reprefill", action="store_true")
  ap.add_argument("--skip-hf", action="store_true")
  ap.add_argument("--profile", default="", help="trace one more turn's decode call here")
  args = ap.parse_args()

  import torch
  from transformers import AutoModelForCausalLM

  from empo2_jax.model import llama
  from empo2_jax.sampling.sampler import SamplerSettings
  from empo2_jax.sampling.session import Session

  config, params, tmp, vocab = bench_model(args.model, args.layers)
  config = dataclasses.replace(config, decode_kernels=args.decode_kernels)
  first, user = workload(np.random.default_rng(0), args, vocab)
  turns = args.turns + bool(args.profile)  # the profiled turn needs room too
  max_tokens = max(len(p) for p in first) + turns * (args.growth + 40) + args.new
  settings = SamplerSettings(cache_dtype=args.cache_dtype)
  print(
    f"model={args.model} layers={config.num_layers} fp32 cache={args.cache_dtype} rows={args.rows} "
    f"decode_kernels={args.decode_kernels}({llama.decode_kernels(config)}) "
    f"prompt~{args.prompt} growth~{args.growth} new={args.new} turns={args.turns} "
    f"max_tokens={max_tokens} devices={platform()} "
    f"torch_threads={torch.get_num_threads()}",
    flush=True,
  )

  results = {}
  sides = (("ours", True),) + (() if args.skip_reprefill else (("reprefill", False),))
  for name, reuse in sides:
    warm = Session(
      params,
      config,
      num_rows=args.rows,
      max_tokens=max_tokens,
      settings=settings,
      reuse_prefix=reuse,
    )
    t0 = time.perf_counter()
    run_session(warm, first, user, args.warmup_turns or args.turns, args.new, 999)
    warm_s = time.perf_counter() - t0
    traced = warm.engine.num_traces
    sess = Session(
      params,
      config,
      num_rows=args.rows,
      max_tokens=max_tokens,
      settings=settings,
      reuse_prefix=reuse,
      engine=warm.engine,
    )
    if name == "ours":  # the limits right before the timed run, in this process
      mm, bw, rd = matmul_gflops(), membw_gbs(), read_gbs()
      dots = decode_dots_ms(params, config, args.rows)
      result(
        "limits",
        matmul_gflops=(mm, ".1f"),
        membw_gbs=(bw, ".2f"),
        read_gbs=(rd, ".2f"),
        dots_ms=(dots, ".1f"),
        flush=True,
      )
      timer = EngineTimer(sess.engine, config, params, args.cache_dtype)
    secs, hist = run_session(sess, first, user, args.turns, args.new, 0)
    results[name] = secs
    per_ep = sess.stats["prefill_tokens"] / args.rows
    print(
      f"{name:10s} {secs:8.2f}s  tokens/s={args.rows * args.turns * args.new / secs:8.1f}  "
      f"turns/s={args.rows * args.turns / secs:7.3f}  prefill_tokens/episode={per_ep:9.0f} "
      f"(computed incl. padding {sess.stats['prefill_computed'] / args.rows:9.0f})  "
      f"warmup {warm_s:.1f}s  compiles={dict(warm.engine.traces)} "
      f"compiles_timed={warm.engine.num_traces - traced}",
      flush=True,
    )
    if name == "ours":
      timer.report(mm, bw, rd, dots)
      if args.profile:
        import os

        hlo = collections.defaultdict(list)  # phase -> compiled HLO texts of the programs it ran
        jitted = {n: getattr(sess.engine, n) for n in ("_prefill", "_prefill_rows", "_decode")}

        def capture(name, fn):
          def call(*a, **kw):
            text = fn.lower(*a, **kw).compile().as_text()  # cached: the program that runs
            phase = name.strip("_").split("_")[0]
            if text not in hlo[phase]:
              hlo[phase].append(text)
            return fn(*a, **kw)

          return call

        for n, fn in jitted.items():
          setattr(sess.engine, n, capture(n, fn))
        timer.trace_dir = args.profile
        run_session(sess, hist, [user[-1]], 1, args.new, 123)
        timer.trace_dir = ""
        for n, fn in jitted.items():
          setattr(sess.engine, n, fn)
        for phase in ("prefill", "decode"):
          profile_ops(phase, os.path.join(args.profile, phase), hlo[phase])
      sess.engine.prefill, sess.engine.decode = timer._prefill, timer._decode

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
      f"turns/s={args.rows * args.turns / secs:7.3f}  (re-reads the full chat every turn)",
      flush=True,
    )

  tps = {
    k: args.rows * args.turns / results.get(k, float("nan")) for k in ("ours", "reprefill", "hf")
  }
  result("sampler turns_per_s", **tps, ratio_vs_hf=tps["ours"] / tps["hf"])


if __name__ == "__main__":
  main()
