"""Prompt growth under memory tips: the tokens of each step's prompt when the steps of an episode
retrieve tips, under our tip placement and under the authors' (both code versions), at the paper's
settings and at the CPU experiment's (docs/fidelity.md, "Tips in the prompt and prompt growth").

The prompts are the project's own: agent/prompts.py messages, tokenised by model/chat.chat_ids with
the chat template of the tokenizer, over real ScienceWorld observations (one JVM; a few seconds).
What differs between the columns is only which user messages carry a tip block:

  tip-free      no tip block anywhere (the "notips" view of rl/batch.py)
  ours          every step's user message keeps its own block for the rest of the episode, and
                every user message ends with the action instruction (agent/prompts.py)
  paper-era     the authors' d38d31c2 placement: when step t retrieves something, every earlier
                step's block is put back into its own user message; when step t retrieves
                nothing, step t's prompt has no block at all; the instruction only closes the last
                user message
  release       the authors' 0b40cb72 placement: the earlier blocks are shown whenever any step
                so far retrieved something; the instruction only closes the last user message
  current-only  (neither version) only step t's block, in step t's user message

Paper settings: the bundled Qwen2.5 tokenizer, the paper's task (power-component) with two gold
examples (env.few_shot=2), a 30-step walk (the first train variation's gold actions but the last,
then seeded random valid actions other than "focus on"), max_prompt_len 8160 (8192 - 32), 10
memories per step of a typical tip (30 tokens: the median of the paper's example tips, appendix
E.1, under this tokenizer) or of a maximal one (tip_max_new_tokens: 128 paper-era; 512 release,
whose tips are stored uncut; ours cuts a tip to 99 words, tips.clean_tip).
CPU settings (configs/sciworld.py:learn,format, the exploration experiment): SmolLM2's tokenizer,
zero-shot prompts, the committed memory episodes of docs/explore (their executed actions replayed
for the observations, the memories each step showed, as recorded), max_prompt_len 2032.

  .venv/bin/python bench/prompt_growth.py [--task power-component] [--seed 0] [--part all|paper|cpu]
"""

from __future__ import annotations

import glob
import json
import os
import random
import statistics

from _common import REPO, parser, result
from empo2_jax.envs.scienceworld.prompts import INSTRUCTION, first_user_message, step_user_message
from empo2_jax.tips import tip_block
from empo2_jax.envs.scienceworld import suite as sciworld_suite
from empo2_jax.envs.scienceworld.env import SciWorldConfig
from empo2_jax.memory.reflect import memory_text
from empo2_jax.tips import clean_tip
from empo2_jax.model.chat import chat_ids

VARIANTS = ("tip-free", "ours", "paper-era", "release", "current-only")
SHOW_STEPS = (1, 2, 3, 5, 10, 15, 20, 25, 30)
TOP_K = 10  # memory.top_k
PAPER_LIMIT = 8192 - 32  # optim.max_prompt_len of the paper config
CPU_LIMIT = 2048 - 16  # configs/sciworld.py:learn
RELEASE_LIMIT = 4500 - 32  # the release yaml's data.max_train_length
RECORDS = "docs/explore/arms/find-non-living-thing"
# Our own filler for synthetic tips, cut to a token count.
FILLER = (
  "I walked to the workshop and looked at the table, picked up the battery and a wire, and "
  "connected one terminal before the steps ran out, so the bulb never lit; next time connect "
  "both wire ends to the battery first, then to the bulb, and check the switch before focusing. "
)


# -- prompts ---------------------------------------------------------------------------------------
def base_messages(material, observations):
  """Each user message's text without a tip block and without the closing instruction."""
  out = []
  for t, obs in enumerate(observations):
    msg = first_user_message(material, obs) if t == 0 else step_user_message(obs)
    assert msg.endswith(INSTRUCTION)
    out.append(msg[: -len(INSTRUCTION)])
  return out


def chat(variant, material, observations, bases, responses, tips, t):
  """The messages of step t's prompt (steps 0..t) under `variant`; tips[s]: step s's memories."""
  any_so_far = any(tips[: t + 1])
  msgs = []
  for s in range(t + 1):
    last = s == t
    if variant == "ours":  # the project's own functions, as the actor calls them
      if s == 0:
        text = first_user_message(material, observations[0], tips[0])
      else:
        text = step_user_message(observations[s], tips[s])
    else:
      shown = {
        "tip-free": (),
        "paper-era": tips[s] if tips[t] else (),
        "release": tips[s] if any_so_far else (),
        "current-only": tips[s] if last else (),
      }[variant]
      end = INSTRUCTION if (last or variant in ("tip-free", "current-only")) else ""
      text = bases[s] + tip_block(shown) + end
    msgs.append({"role": "user", "content": text})
    if not last:
      msgs.append({"role": "assistant", "content": responses[s]})
  return msgs


def lengths(tok, material, observations, responses, tips, steps):
  """{variant: [prompt tokens at step t for t < steps]}."""
  bases = base_messages(material, observations[:steps])
  return {
    v: [
      len(chat_ids(tok, chat(v, material, observations, bases, responses, tips, t)))
      for t in range(steps)
    ]
    for v in VARIANTS
  }


def n_tokens(tok, text):
  return len(tok(text, add_special_tokens=False)["input_ids"])


def tip_of(tok, n):
  """A tip of n tokens of our filler text."""
  ids = tok((FILLER * (1 + n // 40)), add_special_tokens=False)["input_ids"][:n]
  return tok.decode(ids).strip()


# -- the paper's settings --------------------------------------------------------------------------
def walk(env, task, variation, steps, seed):
  """(observations[steps], responses[steps]): gold actions but the last, then random valid ones
  (no "focus on": a wrong focus ends the episode); a finished episode starts again."""
  rng = random.Random(seed)
  gold = env.gold_actions(task, variation)[:-1]
  obs, _ = env.reset(task, variation)
  observations, responses = [obs], []
  while len(responses) < steps:
    i = len(responses)
    if i < len(gold):
      action = gold[i]
    else:
      action = rng.choice([a for a in env.valid_actions() if not a.startswith("focus on")])
    res = env.step(action)
    responses.append(res.info.executed_action)
    if res.done:
      res = env.reset(task, variation)
    observations.append(res.observation)
  return observations[:steps], responses


def show(name, table, limit, steps_shown):
  print(f"\n{name} (prompt tokens at step t; * = over max_prompt_len {limit})")
  print("  step " + "".join(f"{v:>14}" for v in VARIANTS))
  for t in steps_shown:
    cells = "".join(
      f"{table[v][t - 1]:>13}{'*' if table[v][t - 1] > limit else ' '}" for v in VARIANTS
    )
    print(f"  {t:>4} {cells}")
  # the release's own limit: data.max_train_length 4500 (here minus the 32-token response)
  for label, lim, names in (
    ("", limit, VARIANTS),
    (" (release yaml)", RELEASE_LIMIT, ("release",)),
  ):
    first = " ".join(
      f"{v}={next((t + 1 for t, x in enumerate(table[v]) if x > lim), '-')}" for v in names
    )
    print(f"  first step over {lim}{label}: {first}")
    for n in (10, 30):
      over = " ".join(f"{v}={sum(x > lim for x in table[v][:n])}" for v in names)
      print(f"  {n}-step episode, steps over {lim}{label}: {over}")


def paper(args):
  from empo2_jax.model.tokenizer import load_tokenizer

  tok = load_tokenizer(None)
  tok.model_max_length = 1 << 30  # prompts past the model's context are the point here
  env = sciworld_suite.local_env(SciWorldConfig())
  try:
    variation = env.used_variations(args.task, "train")[0]
    material = sciworld_suite.materials(env, args.task, [variation], 2)[(args.task, variation)]
    observations, responses = walk(env, args.task, variation, 30, args.seed)
  finally:
    env.close()
  first = n_tokens(tok, first_user_message(material, observations[0]))
  obs = statistics.median(n_tokens(tok, o) for o in observations[1:])
  print(f"paper settings: {args.task} variation {variation}, Qwen2.5 tokenizer, 2 gold examples")
  print(f"  first user message {first} tokens; later observations median {obs:.0f} tokens")

  def memories(tip):  # 10 entries of one tip, each with another step's action (score 25)
    return tuple(memory_text(tip, responses[k % len(responses)], 25) for k in range(TOP_K))

  kinds = {
    "typical tips (30 tokens)": memories(tip_of(tok, 30)),
    "maximal tips, paper-era and ours (128 tokens, <= 99 words)": memories(
      clean_tip(tip_of(tok, 128))
    ),
    "maximal tips, release (512 tokens, stored uncut)": memories(tip_of(tok, 512)),
  }
  for name, mems in kinds.items():
    block = n_tokens(tok, tip_block(mems))
    entry = statistics.median(n_tokens(tok, m) for m in mems)
    table = lengths(tok, material, observations, responses, [mems] * 30, 30)
    show(
      f"{name}: entry ~{entry:.0f} tokens, block {block} tokens a step",
      table,
      PAPER_LIMIT,
      SHOW_STEPS,
    )
    result(
      "prompt_growth_paper",
      tips=name.split(" (")[0].replace(" ", "_").replace(",", ""),
      block=block,
      ours_step10=table["ours"][9],
      ours_step30=table["ours"][29],
      current_only_step30=table["current-only"][29],
      tip_free_step30=table["tip-free"][29],
    )
  mems = kinds["typical tips (30 tokens)"]
  gap = [() if t % 3 == 2 else mems for t in range(30)]
  table = lengths(tok, material, observations, responses, gap, 30)
  show("typical tips, every third step retrieving none", table, PAPER_LIMIT, (1, 2, 3, 4, 10, 30))


# -- the CPU experiment's settings -----------------------------------------------------------------
def replay(env, e):
  """(observations, responses, tips per step) of a committed episode record."""
  obs, _ = env.reset(e["task"], e["variation"])
  observations, responses, tips, k = [obs], [], [], 0
  for action, n in zip(e["turns"]["executed_action"], e["turns"]["num_tips"]):
    tips.append(tuple(e["tips"][k : k + n]))
    k += n
    res = env.step(action)
    responses.append(action)
    observations.append(res.observation)
    if res.done:
      break
  return observations[: len(responses)], responses, tips[: len(responses)]


def cpu(args):
  from empo2_jax.model import gguf
  from empo2_jax.model.tokenizer import load_tokenizer

  tok = load_tokenizer(gguf.smollm2_gguf_path())
  tok.model_max_length = 1 << 30
  env = sciworld_suite.local_env(SciWorldConfig())
  arms = {"policy tips": "empo2_s*", "rule tips": "empo2_rule_s*"}
  try:
    for name, pattern in arms.items():
      episodes = []
      for f in sorted(glob.glob(os.path.join(REPO, RECORDS, pattern, "episodes/staging/*.jsonl"))):
        with open(f) as fh:
          episodes += [
            e for e in map(json.loads, fh) if e["use_memory"] and any(e["turns"]["num_tips"])
          ]
      blocks, tables, modes = [], [], []
      material_cache = {}
      for e in episodes:
        key = (e["task"], e["variation"])
        if key not in material_cache:
          material_cache[key] = sciworld_suite.materials(env, e["task"], [e["variation"]], 0)[key]
        observations, responses, tips = replay(env, e)
        blocks += [n_tokens(tok, tip_block(t)) for t in tips if t]
        tables.append(lengths(tok, material_cache[key], observations, responses, tips, len(tips)))
        modes.append(e["mode"])
      n = sum(len(tb["ours"]) for tb in tables)
      print(f"\nCPU settings, {name}: {len(tables)} memory episodes of {RECORDS}/{pattern}")
      print(
        f"  tip block {min(blocks)}-{max(blocks)} tokens a step (median "
        f"{statistics.median(blocks):.0f}), SmolLM2 tokenizer"
      )
      for t in range(max(len(tb["ours"]) for tb in tables)):
        cells = "".join(
          f"{statistics.median(tb[v][t] for tb in tables if len(tb[v]) > t):>14.0f}"
          for v in VARIANTS
        )
        if t == 0:
          print("  step " + "".join(f"{v:>14}" for v in VARIANTS) + "   (median over episodes)")
        print(f"  {t + 1:>4} {cells}")
      over = {v: sum(x > CPU_LIMIT for tb in tables for x in tb[v]) for v in VARIANTS}
      print(
        f"  turn samples over {CPU_LIMIT}, of {n}: " + " ".join(f"{v}={c}" for v, c in over.items())
      )
      # optim.prompt_len_check="both" with ratio_variant="paper": an on_tips sample is measured
      # on its tips view, an off sample on its tip-free view only (rl/batch.py views_for)
      dropped = {}
      for mode in sorted(set(modes)):
        view = "ours" if mode == "on_tips" else "tip-free"
        got = [x for tb, m in zip(tables, modes) if m == mode for x in tb[view]]
        dropped[mode] = f"{sum(x > CPU_LIMIT for x in got)}/{len(got)}"
      print(
        "  dropped by our default check, by mode: "
        + " ".join(f"{m}={d}" for m, d in dropped.items())
      )
      result(
        "prompt_growth_cpu",
        tips=name.replace(" ", "_"),
        samples=n,
        **{f"over_{v}": c for v, c in over.items()},
        **{f"dropped_{m}": d for m, d in dropped.items()},
      )
  finally:
    env.close()


def main():
  ap = parser(__doc__)
  ap.add_argument("--task", default="power-component", help="the paper settings' task")
  ap.add_argument("--seed", type=int, default=0, help="the random part of the walk")
  ap.add_argument("--part", default="all", choices=("all", "paper", "cpu"), help="which settings")
  args = ap.parse_args()
  if args.part in ("all", "paper"):
    paper(args)
  if args.part in ("all", "cpu"):
    cpu(args)


if __name__ == "__main__":
  main()
