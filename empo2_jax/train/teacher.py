"""The teacher view's log-probs (rl/loss_terms.py): every turn that a method gave
`teacher_messages` (its chat WITH tips: methods/ctx_distill.py, methods/opid.py) gets
`teacher_logprobs`, its sampled response's log-probs after that chat under the weights the update
starts from, without gradient, at the rollout temperature. The update reads them from the batch
(rl/batch.py teacher_logp).

    stats = score_teacher_views(params, turns, tokenizer, batch_cfg, logprobs_fn)

Each teacher chat is one row of rl/batch.build_batch (one row per turn; a chat over
batch_cfg.max_prompt_len gets no teacher log-probs, counted in teacher_dropped), scored by
rl/update.sample_logprobs_fn in micro-batches.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from empo2_jax.rl import batch as batch_lib


def score_teacher_views(
  params, turns: Sequence, tokenizer, batch_cfg: batch_lib.BatchConfig, logprobs_fn: Callable
) -> dict:
  """Sets turn.teacher_logprobs on the turns with teacher_messages that fit; returns
  {"teacher/turns": scored, "teacher/dropped": over-long} (empty when no turn has a teacher)."""
  todo = [t for t in turns if t.teacher_messages is not None]
  if not todo:
    return {}
  # The teacher chat as the "tips" view of an on-policy turn: tokenised exactly as the sampler's
  # prompts are (rl/batch.prompt_text), the same response ids after it.
  rows = [dataclasses.replace(t, messages=t.teacher_messages, mode="on") for t in todo]
  cfg = dataclasses.replace(batch_cfg, prompt_len_check="both")
  batch, stats = batch_lib.build_batch(rows, np.zeros(len(rows), np.float32), tokenizer, cfg)
  resp_len = batch["response_mask"].shape[1]
  logp = np.asarray(logprobs_fn(params, batch["cur_tokens"], batch["cur_attn"], resp_len))
  for row, i in enumerate(batch["sample_index"]):
    if i >= 0:
      todo[i].teacher_logprobs = [float(x) for x in logp[row, : len(todo[i].response_ids)]]
  return {
    "teacher/turns": float(stats["n_samples"]),
    "teacher/dropped": float(len(todo) - stats["n_samples"]),
  }


__all__ = ["score_teacher_views"]
