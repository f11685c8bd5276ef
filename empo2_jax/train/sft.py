"""Behaviour cloning on gold trajectories, rendered through exactly the actor's chat.

    chats = [gold_chat(material, traj) for ...]            # train variations only
    rows = chat_rows(tokenizer, chats, max_len)            # one packed row per gold episode
    batch = pad_rows(rows, pad_id, bucket)                 # tokens / attn / loss_mask [B, L]
    step = make_sft_step(model_config, SFTConfig())
    state, metrics = step(state, batch)                    # rl.update.TrainState

The chat is the one `agent/actor.py` builds (first user message with task, few-shot examples,
templates, observation and instruction; later user messages with the new observation), with no
tips, and the gold action as each assistant turn. A gold episode becomes one packed row
(rl/packing.py): every position of turn t's answer sees what the actor would have shown the model at
turn t. The loss is the token-mean negative log-likelihood of the assistant answers (their text and
the end-of-turn token); prompts, the chat template's role headers and padding are not scored.
The step and the loss are the LM train step's (programs/train_lm.py), given the loss mask.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from empo2_jax.envs.scienceworld import prompts
from empo2_jax.model.chat import chat_ids
from empo2_jax.model.tokenizer import stop_ids
from empo2_jax.programs.train_lm import LMTrainConfig, make_lm_eval_loss, make_lm_train_step
from empo2_jax.rl.packing import PackedRow, pack_turns


@dataclasses.dataclass(frozen=True)
class SFTConfig(LMTrainConfig):
  """programs/train_lm.LMTrainConfig with SFT's defaults; its optimizer is rl/update's
  make_optimizer (the same AdamW + clip as RL)."""

  lr: float = 1e-4
  weight_decay: float = 0.0
  micro_rows: int = 1  # rows per forward/backward (gradient accumulation unit)


# ---------------------------------------------------------------------------------------------
# Data: gold trajectory -> chat -> packed token row with a loss mask
# ---------------------------------------------------------------------------------------------


def gold_chat(material, traj, max_turns: int = 0) -> list[dict]:
  """The actor's chat for a gold episode: user/assistant messages, the gold action as each answer.

  material: envs.fewshot.PromptMaterial of traj's variation; traj: envs.fewshot.GoldTrajectory.
  max_turns > 0 keeps the first max_turns actions (an episode cut at the agent's step limit).
  """
  steps = traj.steps[:max_turns] if max_turns else traj.steps
  msgs = [{"role": "user", "content": prompts.first_user_message(material, traj.first_observation)}]
  for i, (action, obs) in enumerate(steps):
    msgs.append({"role": "assistant", "content": action})
    if i + 1 < len(steps):
      msgs.append({"role": "user", "content": prompts.step_user_message(obs)})
  return msgs


def chat_turns(tokenizer, messages) -> tuple[list[list[int]], list[list[int]]]:
  """(prompt ids, answer ids) of every assistant turn of `messages`.

  A turn's prompt is what the actor feeds the sampler (the chat before the answer plus the
  generation prompt); its answer is the template's rendering of the assistant message up to and
  including the end-of-turn token, i.e. what the sampler should emit before it stops.
  """
  stops = set(stop_ids(tokenizer))
  out_p, out_r = [], []
  for t, m in enumerate(messages):
    if m["role"] != "assistant":
      continue
    prompt = chat_ids(tokenizer, messages[:t], True)
    full = chat_ids(tokenizer, messages[: t + 1], False)
    if full[: len(prompt)] != prompt:
      raise ValueError(
        f"the chat template does not extend the generation prompt at message {t}; "
        "the tokenizer's template is not a ChatML-style growing chat"
      )
    answer = full[len(prompt) :]
    end = next((i for i, tok in enumerate(answer) if tok in stops), None)
    if end is None:
      raise ValueError(f"no end-of-turn token ({sorted(stops)}) after assistant message {t}")
    out_p.append(prompt)
    out_r.append(answer[: end + 1])
  return out_p, out_r


def chat_rows(tokenizer, chats: Sequence[list[dict]], max_len: int) -> list[PackedRow]:
  """Packed rows for the chats; turns past `max_len` tokens are dropped (with what follows)."""
  rows = []
  for messages in chats:
    for row in pack_turns(*chat_turns(tokenizer, messages)):
      keep = [k for k, (s, n) in enumerate(row.spans) if s + n <= max_len]
      if not keep:
        continue
      last = keep[-1]
      end = row.spans[last][0] + row.spans[last][1]
      rows.append(PackedRow(row.tokens[:end], row.spans[: last + 1], row.turn_ids[: last + 1]))
  return rows


def pad_rows(
  rows: Sequence[PackedRow], pad_id: int, bucket: int = 128, answer_index: bool = False
) -> dict:
  """Right-padded int32 arrays [B, L] (L = the longest row rounded up to `bucket`):
  tokens, attn (1 on real tokens), loss_mask (1 on answer tokens); with answer_index also
  score_index [B, K], each row's answer token positions then 0s (K = the most answers a row
  has, rounded up to 16): the step projects only those onto the vocabulary
  (programs/train_lm.next_token_nll; sft.answer_logits)."""
  length = max(len(r.tokens) for r in rows)
  length = -(-length // bucket) * bucket
  tokens = np.full((len(rows), length), pad_id, np.int32)
  attn = np.zeros((len(rows), length), np.int32)
  loss_mask = np.zeros((len(rows), length), np.int32)
  for b, r in enumerate(rows):
    tokens[b, : len(r.tokens)] = r.tokens
    attn[b, : len(r.tokens)] = 1
    for s, n in r.spans:
      loss_mask[b, s : s + n] = 1
  out = {"tokens": tokens, "attn": attn, "loss_mask": loss_mask}
  if answer_index:
    counts = loss_mask.sum(1)
    k = max(16, -(-int(counts.max()) // 16) * 16)
    index = np.zeros((len(rows), k), np.int32)
    for b in range(len(rows)):
      pos = np.nonzero(loss_mask[b])[0]
      index[b, : len(pos)] = pos
    out["score_index"] = index
  return out


# ---------------------------------------------------------------------------------------------
# The step: programs/train_lm.py on {tokens, attn, loss_mask}
# ---------------------------------------------------------------------------------------------


def make_sft_step(model_config, cfg: SFTConfig, optimizer=None):
  """jit(step)(state, batch {tokens, attn, loss_mask} [B, L]) -> (state, metrics {loss,
  grad_norm, tokens}): one optimizer step on the token-mean answer NLL of the batch, gradients
  summed over micro-batches of cfg.micro_rows rows (B must be a multiple of it). The state
  (rl.update.TrainState) is donated. programs/train_lm.make_lm_train_step on one device."""
  return make_lm_train_step(model_config, cfg, optimizer=optimizer)


def make_eval_loss(model_config, cfg: SFTConfig):
  """jit(f)(params, batch) -> token-mean answer NLL of the whole batch (no update)."""
  return make_lm_eval_loss(model_config, cfg)


__all__ = [
  "SFTConfig",
  "gold_chat",
  "chat_turns",
  "chat_rows",
  "pad_rows",
  "make_sft_step",
  "make_eval_loss",
]
