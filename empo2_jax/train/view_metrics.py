"""An iteration's metrics of its rollout and batch (`iteration_metrics`), and the per-view
instrumentation: what the low-probability mask (docs/method.md §5) and
the prompt-length check did to each view's samples, and how many tips each memory step showed.

    per = update_metrics.pop("per_sample")            # rl/update.per_sample_stats, [B, T] arrays
    attach(turns, batch["sample_index"], per)          # each trained turn: masked, min_old_logp
    metrics.update(view_metrics(turns, episodes, rollout_stats, response_len, delta))

A view is a turn's mode (rl/batch.MODES: "on", "on_tips", "off"; one per iteration in EMPO2's
trainer, several where a method mixes them). Keys `view/<mode>/<name>`, only for the modes present:
  turns              trainable turns of that mode (env not failed)
  samples            those in the update's batch (the rest were dropped as too long)
  dropped_long       not in the batch because the prompt was longer than max_prompt_len
  dropped_response   not in the batch because the response was longer than response_len
  pos_adv            samples with a positive advantage
  masked             samples the low-probability mask removed (0 with loss.low_prob_mask off)
  masked_pos_adv     ... of them with a positive advantage (what the mask costs distillation)
  below_delta        samples whose min old log-prob is below loss.low_prob_delta: what the mask
                     removes, or would remove where it is off
  kept_tokens        response tokens that enter the loss (masked samples' tokens excluded)
  old_logp_mean      old log-prob per response token over the samples (the update's old view:
                     tip-free for "off" under ratio_variant=paper, the prompt as sampled else)
  old_logp_min       the lowest old log-prob of any sample's token
  min_old_logp_mean  the mean over samples of each sample's lowest token old log-prob
  context_truncations  sampler history truncations in the rollout (sampling/session.py)
  prompt_tokens_mean, prompt_tokens_max  each step's whole chat as sampled, tip blocks included
                     (before the sampler's truncation to rollout.max_context)
  memory_steps, tips_mean, tips_min, tips_max, tips_zero  steps with memory, and the tips
                     retrieved per step (their count distribution; tips_zero: steps with none)
Saved episodes (data/trajectories.py) keep, per turn, `lowprob_masked` (1 masked, 0 kept, -1 not
in the update) and `min_old_logp` (0 where not in the update).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from empo2_jax.rl.batch import MODES
from empo2_jax.train.metrics import episode_summary

MASK_KEYS = ("masked", "min_old_logp", "old_logp_sum", "tokens")  # rl/update.per_sample_stats


def attach(turns: Sequence, sample_index, per_sample: dict | None) -> None:
  """Sets `lowprob_masked` (bool) and `min_old_logp` (float) on every turn in the update's batch
  (sample_index [B] or [B, T], -1 on padding); the other turns get None."""
  for t in turns:
    t.lowprob_masked, t.min_old_logp = None, None
  if per_sample is None:
    return
  idx = np.asarray(sample_index).reshape(-1)
  masked = np.asarray(per_sample["masked"]).reshape(-1)
  low = np.asarray(per_sample["min_old_logp"]).reshape(-1)
  if not (len(idx) == len(masked) == len(low)):
    raise ValueError(f"sample_index has {len(idx)} entries, per_sample {len(masked)}")
  for k in np.flatnonzero(idx >= 0):
    t = turns[int(idx[k])]
    t.lowprob_masked, t.min_old_logp = bool(masked[k]), float(low[k])


def _sample_stats(turns, sample_index, per_sample: dict | None) -> dict:
  """{turn index: (masked, min_old_logp, old_logp_sum, tokens)} of the batch's samples."""
  if per_sample is None:
    return {}
  idx = np.asarray(sample_index).reshape(-1)
  cols = [np.asarray(per_sample[k]).reshape(-1) for k in MASK_KEYS]
  return {int(i): tuple(c[k] for c in cols) for k, i in enumerate(idx) if i >= 0}


def view_metrics(
  turns: Sequence,
  sample_index,
  per_sample: dict | None,
  episodes: Sequence,
  rollout_stats: dict,
  *,
  response_len: int,
  low_prob_delta: float,
) -> dict:
  """The `view/<mode>/...` metrics (module docstring) of one iteration. `turns` are the trainable
  turns in the order the batch indexes them; each carries `advantage` (the trainer sets it)."""
  samples = _sample_stats(turns, sample_index, per_sample)
  out: dict = {}
  for mode in MODES:
    idx = [i for i, t in enumerate(turns) if t.mode == mode]
    eps = [e for e in episodes if e.mode == mode and not e.env_failed]
    if not idx and not eps:
      continue
    pre = f"view/{mode}/"
    got = [i for i in idx if i in samples]
    out_of_batch = [i for i in idx if i not in samples]
    long_resp = sum(len(turns[i].response_ids) > response_len for i in out_of_batch)
    masked = [i for i in got if samples[i][0]]
    pos = [i for i in got if (turns[i].advantage or 0.0) > 0]
    lows = np.array([samples[i][1] for i in got if samples[i][3] > 0], np.float64)
    tok = sum(int(samples[i][3]) for i in got)
    out.update(
      {
        pre + "turns": len(idx),
        pre + "samples": len(got),
        pre + "dropped_long": len(out_of_batch) - long_resp,
        pre + "dropped_response": long_resp,
        pre + "pos_adv": len(pos),
        pre + "masked": len(masked),
        pre + "masked_pos_adv": sum(1 for i in masked if (turns[i].advantage or 0.0) > 0),
        pre + "below_delta": int(np.sum(lows < low_prob_delta)),
        pre + "kept_tokens": sum(int(samples[i][3]) for i in got if not samples[i][0]),
        pre + "old_logp_mean": float(sum(samples[i][2] for i in got) / tok) if tok else 0.0,
        pre + "old_logp_min": float(lows.min()) if lows.size else 0.0,
        pre + "min_old_logp_mean": float(lows.mean()) if lows.size else 0.0,
      }
    )
    # The rollout ran one mode: its sampler counters belong to that mode's view.
    if eps and all(e.mode == mode for e in episodes):
      out[pre + "context_truncations"] = int(rollout_stats.get("truncations", 0))
    lengths = np.array([n for e in eps for n in getattr(e, "prompt_tokens", [])], np.int64)
    if lengths.size:  # the chat as sampled (tip blocks included), before sampler truncation
      out[pre + "prompt_tokens_mean"] = float(lengths.mean())
      out[pre + "prompt_tokens_max"] = int(lengths.max())
    shown = np.array([n for e in eps if e.use_memory for n in e.retrieved], np.int64)
    if shown.size:
      out.update(
        {
          pre + "memory_steps": int(shown.size),
          pre + "tips_mean": float(shown.mean()),
          pre + "tips_min": int(shown.min()),
          pre + "tips_max": int(shown.max()),
          pre + "tips_zero": int(np.sum(shown == 0)),
        }
      )
  return out


def iteration_metrics(
  mode: str, episodes: list, turns: list, advantages, stats: dict, bstats: dict, memory_size: int
) -> dict:
  """The iteration's rollout, memory and batch metrics (the update's, the views' and the timings
  are added by Trainer.train_iteration). `stats`: the rollout's and reflection's counts;
  `bstats`: rl/batch's; `memory_size`: tips in memory after the reflection."""
  summary = episode_summary(episodes)
  ok = [e for e in episodes if not e.env_failed]
  intrinsic = [t.intrinsic for t in turns]
  memory_steps = stats.get("memory_steps")
  return {
    "mode": mode,
    "mode_id": MODES.index(mode),
    "return_mean": summary["return_mean"],
    "return_std": summary["return_std"],
    "success": summary["success"],
    "episode_steps": float(np.mean([len(e.turns) for e in ok])) if ok else 0.0,
    "env_steps": int(sum(len(e.turns) for e in ok)),  # this iteration's; plot.py --x=env_steps
    "env_failed": summary["env_failed"],
    "intrinsic_mean": float(np.mean(intrinsic)) if intrinsic else 0.0,
    "memory_size": memory_size,
    "retrieval_hits_per_step": stats["retrieved"] / memory_steps if memory_steps else 0.0,
    "tips_written": stats.get("tips", 0),
    "memory_writes": stats.get("memory_writes", 0),
    "prefill_tokens": stats.get("prefill_tokens", 0),
    "reused_tokens": stats.get("reused_tokens", 0),
    "samples": bstats["n_samples"],
    "dropped_long": bstats["n_dropped_prompt"],
    "train_tokens": bstats["tokens"],
    "batch_rows": bstats["rows"],
    "advantage_abs_mean": float(np.abs(advantages).mean()) if len(turns) else 0.0,
    "groups_mixed": mixed_share(ok),
  }


def mixed_share(episodes: list) -> float:
  """The share of groups (group_id) whose episodes' returns are not all equal: the groups that
  give GRPO an advantage (a group of equal returns has none)."""
  groups: dict = {}
  for e in episodes:
    groups.setdefault(e.group_id, set()).add(float(e.episode_return))
  return sum(len(r) > 1 for r in groups.values()) / len(groups) if groups else 0.0


__all__ = ["attach", "iteration_metrics", "mixed_share", "view_metrics"]
