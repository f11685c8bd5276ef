"""The distillation probe: does a checkpoint, without tips, assign more probability to what the
policy did WITH tips? (EMPO2's off-policy update is meant to move exactly that; docs/method.md §4.)

    records = probe_records(episode_records(run + "/episodes"))   # tip-guided episodes' turns
    write_probe("probe.jsonl", records)
    result = score(params, model_config, tokenizer, read_probe("probe.jsonl"))
    result["sets"]["success"]["logp_mean"], result["sets"]["success"]["top1"]

A probe sample is one turn of an episode that was rolled out with memory tips in its prompts: the
tip-free chat up to that turn (every `<tip>` block removed, as the paper's off-policy update sees
it) and the response tokens as sampled. Samples fall into two sets by their episode's outcome:
"success" (the env's success flag) and "failed". The probe episodes should come from variations
the update never trains on (launch/probe.py make --split=dev), so a rise is transfer, not replay.

Scored per set, tip-free, at temperature 1: logp_mean (mean log-prob per response token),
sample_logp_mean (the mean over samples of each sample's per-token mean), top1 (the share of
response tokens that are the model's greedy choice at their position) and the counts. One forward
pass per episode: its turns are packed into one row (rl/packing.py), so each turn's response is
scored with exactly the chat before it. The logits at response positions are computed whole
(log_softmax and argmax): probe sets are small, and the top-1 needs the full row anyway.
"""

from __future__ import annotations

import json
from typing import Iterable, Optional, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from etils import epath

from empo2_jax.model import llama
from empo2_jax.rl.batch import BatchConfig, Turn, build_packed_batch
from empo2_jax.tips import strip_tips

PROBE_SETS = ("success", "failed")


# ---------------------------------------------------------------------------- probe sets
def episode_records(episodes_dir) -> list[dict]:
  """Every episode record (data/trajectories.episode_record) in an EpisodeLog directory's
  staging files (<run>/episodes; gs:// too), in iteration order."""
  from empo2_jax.data.trajectories import EpisodeLog

  if not (epath.Path(episodes_dir) / "staging").is_dir():  # EpisodeLog would create it
    raise FileNotFoundError(
      f"{episodes_dir}/staging does not exist: pass a run's episodes directory "
      "(train.save_episodes=True)"
    )
  return list(EpisodeLog(episodes_dir).records())


def probe_records(
  episodes: Iterable[dict], variations: Optional[Sequence[int]] = None, min_tips: int = 1
) -> list[dict]:
  """Probe samples (module docstring) from episode records: every turn of every episode that ran
  with memory, showed at least `min_tips` tips over its turns and whose env did not fail;
  `variations` (optional) keeps only those variations."""
  keep = None if variations is None else {int(v) for v in variations}
  out = []
  for n, ep in enumerate(episodes):
    turns = ep["turns"]
    if not ep["use_memory"] or ep["env_failed"] or sum(turns["num_tips"]) < min_tips:
      continue
    if keep is not None and int(ep["variation"]) not in keep:
      continue
    ids = ep["response_ids"]
    offsets = np.concatenate([[0], np.cumsum(turns["num_tokens"])]).astype(int)
    # episode_id is unique within one rollout, not across an evaluation's parts or files (each
    # part numbers its episodes from 0): the sample ids carry the episode's position as well.
    key = f"{n}:{ep['episode_id']}"
    messages: list[dict] = []
    for t, (prompt, action) in enumerate(zip(turns["prompt"], turns["raw_action"])):
      messages = messages + [{"role": "user", "content": strip_tips(prompt)}]
      out.append(
        {
          "id": f"{key}/{t}",
          "set": "success" if ep["success"] else "failed",
          "task": ep["task"],
          "variation": int(ep["variation"]),
          "episode_id": key,
          "episode_index": n,
          "step": t,
          "messages": messages,
          "response_ids": [int(x) for x in ids[offsets[t] : offsets[t + 1]]],
        }
      )
      messages = messages + [{"role": "assistant", "content": action}]
  return out


def cap_episodes(records: Sequence[dict], which: str, max_episodes: int) -> list[dict]:
  """The records with at most `max_episodes` episodes of set `which` (the first in the order
  the episodes were given; 0: no cap); the other set is kept whole."""
  if not max_episodes:
    return list(records)
  first = {r["episode_id"]: r.get("episode_index", 0) for r in records if r["set"] == which}
  kept = set(sorted(first, key=lambda e: (first[e], e))[:max_episodes])
  return [r for r in records if r["set"] != which or r["episode_id"] in kept]


def write_probe(path, records: Sequence[dict]) -> None:
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_probe(path) -> list[dict]:
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"no probe file {path}: make one with launch/probe.py make")
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  bad = [r.get("id") for r in records if r.get("set") not in PROBE_SETS]
  if bad:
    raise ValueError(f"{path}: samples with a set other than {PROBE_SETS}: {bad[:3]}")
  return records


def summary(records: Sequence[dict]) -> dict:
  """{set: (samples, episodes, variations)} of a probe set."""
  out = {}
  for s in PROBE_SETS:
    rs = [r for r in records if r["set"] == s]
    out[s] = {
      "samples": len(rs),
      "episodes": len({r["episode_id"] for r in rs}),
      "variations": sorted({r["variation"] for r in rs}),
    }
  return out


# ---------------------------------------------------------------------------- scoring
def _turns(records: Sequence[dict], with_tips: bool = False) -> list[Turn]:
  """The samples as turns of mode 'off' (ratio 'paper': both views tip-free) or, with_tips,
  'on_tips' (the chat as given, tips shown), one rollout an episode, so build_packed_batch packs
  each episode's turns into one row."""
  episode_of = {e: k for k, e in enumerate(dict.fromkeys(r["episode_id"] for r in records))}
  return [
    Turn(
      messages=r["messages"],
      response="",
      response_ids=r["response_ids"],
      sampler_logprobs=[0.0] * len(r["response_ids"]),
      mode="on_tips" if with_tips else "off",
      group_id=0,
      rollout_id=episode_of[r["episode_id"]],
      step=int(r["step"]),
      episode_return=0.0,
    )
    for r in records
  ]


def make_scorer(model_config):
  """jit(f)(params, tokens [b, L], attn [b, L], starts [b, T], R) -> (logp, greedy) [b, T, R]:
  each response position's log-prob of its token (temperature 1) and whether it is the argmax."""

  def f(params, tokens, attn, starts, resp_len):
    length = tokens.shape[1]
    hidden = llama.forward(params, model_config, tokens, attn, return_hidden=True)
    pos = starts[:, :, None] + jnp.arange(resp_len)[None, None, :]
    b_idx = jnp.arange(tokens.shape[0])[:, None, None]
    h = hidden[b_idx, jnp.clip(pos - 1, 0, length - 1)]  # [b, T, R, D]
    target = tokens[b_idx, jnp.clip(pos, 0, length - 1)]
    w = llama.output_embedding(params, model_config)
    z = jnp.einsum("btrd,dv->btrv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    logp_all = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(logp_all, target[..., None], axis=-1)[..., 0]
    return logp, jnp.argmax(z, axis=-1) == target

  return jax.jit(f, static_argnums=(4,))


def score(
  params,
  model_config,
  tokenizer,
  records: Sequence[dict],
  *,
  max_prompt_len: int = 8192,
  rows: int = 1,
  scorer=None,
  with_tips: bool = False,
) -> dict:
  """The probe's figures for `params` (module docstring): {"sets": {set: figures}, "samples":
  {id: {"logp", "top1", "tokens"}}, "dropped_long": samples whose prompt exceeds
  max_prompt_len}. `rows`: packed rows per forward pass. with_tips: score the chats as given,
  tip blocks included (default: tip-free, as the probe's question asks)."""
  if not records:
    raise ValueError("the probe set is empty: no tip-guided episodes were found")
  if len({r["id"] for r in records}) != len(records):
    raise ValueError("the probe set repeats sample ids: rebuild it with launch/probe.py --make")
  turns = _turns(records, with_tips)
  cfg = BatchConfig(
    max_prompt_len=max_prompt_len,
    prompt_len_check="both",
    response_len=max(len(r["response_ids"]) for r in records),
    ratio_variant="paper",
    micro_rows=rows,
    pad_id=int(tokenizer.pad_token_id),
  )
  batch, stats = build_packed_batch(turns, np.zeros(len(turns)), tokenizer, cfg)
  scorer = scorer or make_scorer(model_config)
  n_rows, _, resp_len = batch["response_mask"].shape
  logp = np.zeros(batch["response_mask"].shape, np.float64)
  greedy = np.zeros(batch["response_mask"].shape, bool)
  for b0 in range(0, n_rows, rows):
    part = slice(b0, b0 + rows)
    if not (batch["sample_index"][part] >= 0).any():
      continue
    lp, gr = scorer(
      params,
      jnp.asarray(batch["cur_tokens"][part]),
      jnp.asarray(batch["cur_attn"][part]),
      jnp.asarray(batch["cur_starts"][part]),
      resp_len,
    )
    logp[part], greedy[part] = np.asarray(lp), np.asarray(gr)
  samples = {}
  mask = batch["response_mask"] > 0
  for b, t in zip(*np.nonzero(batch["sample_index"] >= 0)):
    r = records[int(batch["sample_index"][b, t])]
    m = mask[b, t]
    samples[r["id"]] = {
      "logp": float(logp[b, t][m].mean()),
      "logp_sum": float(logp[b, t][m].sum()),
      "top1": float(greedy[b, t][m].mean()),
      "top1_sum": int(greedy[b, t][m].sum()),
      "tokens": int(m.sum()),
    }
  sets = {}
  for s in PROBE_SETS:
    got = [samples[r["id"]] for r in records if r["set"] == s and r["id"] in samples]
    tokens = sum(g["tokens"] for g in got)
    sets[s] = {
      "samples": len(got),
      "tokens": tokens,
      "logp_mean": sum(g["logp_sum"] for g in got) / tokens if tokens else float("nan"),
      "sample_logp_mean": float(np.mean([g["logp"] for g in got])) if got else float("nan"),
      "top1": sum(g["top1_sum"] for g in got) / tokens if tokens else float("nan"),
    }
  return {"sets": sets, "samples": samples, "dropped_long": stats["n_dropped_prompt"]}


__all__ = [
  "PROBE_SETS",
  "episode_records",
  "probe_records",
  "cap_episodes",
  "write_probe",
  "read_probe",
  "summary",
  "make_scorer",
  "score",
]
