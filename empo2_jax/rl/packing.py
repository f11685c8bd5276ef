"""Episode packing: one token row per episode instead of one row per turn.

An episode's chat only grows (envs/scienceworld/prompts.py): turn t+1's prompt starts with the
prompt of turn t followed by turn t's response. A packed row is the last turn's prompt + response,
with each turn's response positions marked:

    row     = prompt_0 + resp_0 + (new user tokens) + resp_1 + ... + resp_T
    spans   = [(start_t, len(resp_t)) for each turn t]  (start_t: index of resp_t's first token)

A causal model sees, at every position of resp_t, exactly the tokens it would see in turn t's own
row, so per-token log-probs are equal. That holds only when the next prompt really extends the
previous prompt + response token by token; re-tokenising the chat can break it (the model's raw
text is stripped, BPE merges across the boundary, the sampler truncated the history). `pack_turns`
checks the prefix property and starts a new row where it fails, so a turn is never packed under a
history it did not see.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp

from empo2_jax.model import llama
from empo2_jax.rl.logprobs import token_logprobs


@dataclasses.dataclass
class PackedRow:
  tokens: list[int]
  spans: list[tuple[int, int]]  # (start, length) of each packed turn's response
  turn_ids: list[int]  # which input turn each span belongs to


def pack_turns(
  prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
) -> list[PackedRow]:
  """Packs the turns of ONE episode, in order, into as few rows as the prefix property allows.

  Turn t joins the current row when prompts[t] starts with the row so far (the previous prompt +
  response); otherwise it opens a new row.

  Args:
    prompts: T lists of token ids, prompts[t] the prompt of turn t.
    responses: T lists of token ids, responses[t] the response of turn t.
  Returns:
    The packed rows, in turn order; each turn appears in exactly one.
  """
  if len(prompts) != len(responses):
    raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
  return [row["x"] for row in pack_views({"x": [list(p) for p in prompts]}, responses)]


def pack_views(prompts: dict, responses: Sequence[Sequence[int]]) -> list[dict]:
  """Joint packing of several prompt views of ONE episode's turns (e.g. with and without tips).

  A turn joins the current row only if EVERY view's prompt extends that view's row so far, so
  all views split the turns into the same rows.

  Args:
    prompts: {view: T lists of token ids}, the prompt of each turn in that view.
    responses: T lists of token ids, the response of each turn (the same in every view).
  Returns:
    One dict per row: {view: PackedRow} (every view's PackedRow has the same turn_ids).
  """
  views = list(prompts)
  rows: list[dict] = []
  for t, resp in enumerate(responses):
    resp = list(resp)
    cur = rows[-1] if rows else None
    if cur is None or not all(
      prompts[v][t][: len(cur[v].tokens)] == cur[v].tokens
      and len(prompts[v][t]) >= len(cur[v].tokens)
      for v in views
    ):
      cur = {v: PackedRow([], [], []) for v in views}
      rows.append(cur)
    for v in views:
      row = cur[v]
      row.tokens.extend(prompts[v][t][len(row.tokens) :])
      row.spans.append((len(row.tokens), len(resp)))
      row.turn_ids.append(t)
      row.tokens.extend(resp)
  return rows


# ---------------------------------------------------------------------------------------------
# Kernel: log-probs of every packed turn's response
# ---------------------------------------------------------------------------------------------


def packed_response_logprobs(
  params,
  config,
  tokens_bl,
  attn_bl,
  starts_bt,
  response_len: int,
  *,
  temperature: float = 1.0,
  chunk_size: int = 8192,
  with_entropy: bool = False,
  inv_temperature=None,
  layer_grads=None,
):
  """Log-probs of the R tokens from each span start (one forward per packed row).

  Entry [b, t, j] is log p(tokens[b, s + j] | tokens[b, :s + j]) with s = starts[b, t];
  positions past the row end are clamped and must be masked by the caller (the response mask),
  as must padding turns. Only the B*T*R hidden states that predict response tokens go through the
  vocabulary projection.

  Args:
    params: the model's params (model/llama.py).
    config: its LlamaConfig.
    tokens_bl: [B, L] int token ids of the packed rows (right padding).
    attn_bl: [B, L] attention mask, 1 on real tokens.
    starts_bt: [B, T] int32 first response position of each packed turn (>= 1).
    response_len: R.
    temperature, chunk_size, with_entropy: as rl/logprobs.token_logprobs.
    inv_temperature: None, or [B, T, R] each token's 1/tau, replacing `temperature`
      (rl/logprobs.token_logprobs).
    layer_grads: the layers' gradient accumulator of llama.forward (model/grad_accum.py).
  Returns:
    [B, T, R] float32 log-probs, or ([B, T, R], entropy [B, T, R]) with with_entropy=True.
  """
  length = tokens_bl.shape[1]
  hidden = llama.forward(
    params, config, tokens_bl, attn_bl, return_hidden=True, layer_grads=layer_grads
  )  # [B, L, D]
  pos = starts_bt[:, :, None] + jnp.arange(response_len)[None, None, :]  # [B, T, R]
  tgt_pos = jnp.clip(pos, 0, length - 1)
  h_pos = jnp.clip(pos - 1, 0, length - 1)
  b_idx = jnp.arange(tokens_bl.shape[0])[:, None, None]
  h_btrd = hidden[b_idx, h_pos]
  targets = tokens_bl[b_idx, tgt_pos]
  return token_logprobs(
    h_btrd,
    llama.output_embedding(params, config),
    targets,
    temperature=temperature,
    chunk_size=chunk_size,
    with_entropy=with_entropy,
    inv_temperature=inv_temperature,
  )


__all__ = ["PackedRow", "pack_turns", "pack_views", "packed_response_logprobs"]
