"""Where the `make train` process's memory goes (configs/sciworld.py:cpu, SmolLM2-135M fp32): the
pieces the trainer builds, one after another in one process, with the resident size each adds,
then the peaks of a rollout-sized prefill + decode and of an update.

  .venv/bin/python bench/host_memory.py [--config configs/sciworld.py:cpu] [--rows 4]
                                        [--prompt 1400] [--episodes 4] [--turns 4]

Lines:
  `host_memory piece=<name> rss_gib=<after> added_gib=<>` after each piece, with what it should
  hold (`expect_gib=`) where that is a formula: params = 4 bytes x parameters; AdamW = 2 x params
  (mu, nu); sampler cache = rows x (max_context + max prefill chunk) x layers x 2 (k, v) x
  kv_heads x head_dim x 4 bytes.
  `host_memory peak=<phase> peak_gib=<> above_gib=<>`: the high-water mark of a phase (reset at
  its start after a trim, train/hoststats.PhasePeaks) and how far above the resident size before
  it: `prefill` (every slot prefilled with --prompt tokens, then --new tokens decoded),
  `update_compile` (AOT compile of the update) and `update` (one update on a packed batch of
  --episodes x --turns synthetic turns, bench/update.synthetic_batch).
  `host_memory program=update temp_gib= argument_gib= output_gib= alias_gib= grads_gib=`: the
  compiled update's memory plan (compiled.memory_analysis(): the temp block holds everything the
  program allocates itself), beside 2 x params to read it against (the float32 gradient
  accumulator, and what else is params-sized: before the fused layer gradients of
  model/grad_accum.py a micro-batch's whole gradient, now XLA's copy of the params at each step).
The env workers and their JVMs are separate processes (`host/children_rss_gib` in a run's metrics:
0.5-0.9 GiB for 2 workers) and are not counted here.
"""

from __future__ import annotations

import numpy as np

from _common import parser, result
from update import synthetic_batch


def main():
  ap = parser(__doc__)
  ap.add_argument("--config", default="configs/sciworld.py:cpu")
  ap.add_argument("--rows", type=int, default=0, help="sampler rows (0: variations x group)")
  ap.add_argument("--prompt", type=int, default=1400, help="tokens prefilled per slot")
  ap.add_argument("--new", type=int, default=16, help="tokens decoded per slot")
  ap.add_argument("--episodes", type=int, default=4)
  ap.add_argument("--turns", type=int, default=4)
  ap.add_argument("--response", type=int, default=16)
  a = ap.parse_args()

  import jax
  import jax.numpy as jnp

  from empo2_jax.train.hoststats import PhasePeaks, release_host_memory

  last = [release_host_memory()]
  result("host_memory", piece="start", rss_gib=(last[0], ".2f"), flush=True)

  def piece(name, expect=None):
    rss = release_host_memory()
    vals = dict(piece=name, rss_gib=(rss, ".2f"), added_gib=(rss - last[0], ".2f"))
    if expect is not None:
      vals["expect_gib"] = (expect, ".2f")
    result("host_memory", flush=True, **vals)
    last[0] = rss

  jnp.ones(1).block_until_ready()
  piece("jax_runtime")

  from empo2_jax.defaults import load_config
  from empo2_jax.rl import update as update_lib
  from empo2_jax.sampling.sampler import SamplerSettings
  from empo2_jax.sampling.session import Session
  from empo2_jax.train import build, settings

  piece("imports")
  c = load_config(a.config)
  model_config, params = build.policy(c)
  jax.block_until_ready(params)  # dispatch is asynchronous: count the buffers where they land
  n_params = sum(x.size for x in jax.tree.leaves(params))
  pbytes = sum(x.nbytes for x in jax.tree.leaves(params)) / 2**30
  piece("params", expect=pbytes)
  ucfg = settings.update_config(c)
  opt = update_lib.make_optimizer(ucfg)
  state = jax.block_until_ready(update_lib.init_train_state(params, opt))
  del params  # the train state holds them
  piece("adamw_moments", expect=2 * pbytes)
  encoder, _, _ = build.memory(c)
  encoder.encode(["look around", "open door to kitchen"])
  piece("minilm_encoder")
  tok = build.tokenizer(c)
  piece("tokenizer")

  rows = a.rows or c.rollout.variations_per_iter * c.rollout.group_size
  # the actor's sampler: default SamplerSettings with the config's cache dtype (agent/actor.py)
  sampler_settings = SamplerSettings(cache_dtype=c.rollout.cache_dtype)
  session = Session(state.params, model_config, num_rows=rows, max_tokens=c.rollout.max_context,
                    settings=sampler_settings)  # fmt: skip
  cfgm = model_config
  slots = c.rollout.max_context + sampler_settings.max_chunk
  per_value = np.dtype(jnp.dtype(c.rollout.cache_dtype)).itemsize
  cache = rows * slots * cfgm.num_layers * 2 * cfgm.num_kv_heads * cfgm.head_dim * per_value
  cache /= 2**30
  piece("sampler_cache", expect=cache)

  def peak(name, fn, **extra):
    """fn()'s value; prints the high-water mark during fn and how far above the resident size
    before it (PhasePeaks trims first, so both are measured from live memory)."""
    peaks = PhasePeaks()
    before = release_host_memory()
    with peaks.phase(name):
      out = fn()
    p = peaks.pop()[f"host/peak_rss_gib/{name}"]
    result("host_memory", peak=name, peak_gib=(p, ".2f"), above_gib=(p - before, ".2f"), **extra)
    return out

  rng = np.random.default_rng(0)
  hists = {r: rng.integers(100, 20_000, a.prompt).tolist() for r in range(rows)}
  peak("prefill", lambda s=session: s.step(hists, max_new_tokens=a.new, rng=jax.random.PRNGKey(0)))
  del session
  piece("after_rollout")

  ucfg, batch, _, _ = synthetic_batch(c, tok, ucfg, a.episodes, a.turns, a.response)
  flag = np.bool_(True)
  fn = update_lib.make_update_fn(model_config, ucfg, opt)
  compiled = peak("update_compile", lambda: fn.lower(state, batch, None, flag).compile())
  piece("update_program")
  ma = compiled.memory_analysis()  # XLA's buffer plan: one temp block for the program's live set
  if ma is not None:
    result(
      "host_memory",
      program="update",
      temp_gib=(ma.temp_size_in_bytes / 2**30, ".2f"),
      argument_gib=(ma.argument_size_in_bytes / 2**30, ".2f"),
      output_gib=(ma.output_size_in_bytes / 2**30, ".2f"),
      alias_gib=(ma.alias_size_in_bytes / 2**30, ".2f"),
      grads_gib=(2 * pbytes, ".2f"),  # 2 x params: the accumulator and one more params-sized buffer
    )
  peak(
    "update",
    lambda: jax.block_until_ready(compiled(state, batch, None, flag)),
    tokens=int(np.asarray(batch["cur_attn"]).sum()),
    rows=int(batch["cur_tokens"].shape[0]),
    row_len=int(batch["cur_tokens"].shape[1]),
    params_m=n_params / 1e6,
  )


if __name__ == "__main__":
  main()
