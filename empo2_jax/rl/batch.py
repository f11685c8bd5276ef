"""Turn samples -> padded token batches for the update (docs/method.md §4).

Every turn of every episode is one sample: prompt = the chat so far (up to and including the last
user message), response = the action as sampled. A sample has two prompt views:
  "tips"   the messages as sampled (memory tip blocks included; identical to "notips" on-policy)
  "notips" every `<tip>...</tip>` block removed from the message text, then re-tokenised.
The response tokens are the sampled ids in both views; token spans are never cut.

Which view feeds which log-prob (current pi_theta / old pi_old):
  mode "on"                 tips / tips   (there are no tips)
  mode "on_tips"            tips / tips
  mode "off", ratio "paper"   notips / notips
  mode "off", ratio "release" notips / tips

Batch layout (numpy, one row per sample; L = P + R):
  cur_tokens, cur_attn [B, L] int32   view for the current log-prob
  old_tokens, old_attn [B, L] int32   view for the old log-prob
  response_mask        [B, R] float32 1 on real response tokens
  sampler_logp         [B, R] float32 the sampler's log-probs of the response tokens
  advantages           [B]    float32
  sample_index         [B]    int32   index into the input turns; -1 on padding rows
  token_temperature    [B, R] float32 only when a turn has token_temps: each response token's
                                      sampling temperature (0: the rollout temperature)
  shaping_gamma        [B]    float32 only when a turn has shaping_gamma > 0: the turn's
                                      policy-shaping constant (0: the clipped surrogate)
  teacher_logp         [B, R] float32 only when a turn has teacher_logprobs: the response's
                                      log-probs after the prompt WITH tips (the teacher view of
                                      rl/loss_terms.py; train/teacher.py scores it); 0 elsewhere
  teacher_mask         [B]    float32 1: the row's turn has teacher log-probs
Prompt-length check (`BatchConfig.prompt_len_check`): a sample whose prompt is too long is
dropped. "both" (ours) measures every view the sample uses against max_prompt_len. "sampled" (the
authors' release, docs/fidelity.md) measures the prompt as sampled, tips included, plus the
response: prompt + response > max_prompt_len drops the sample, whatever view the update reads
(the release drops it before its advantages; here the advantages are computed first). "tip_free"
(a variant of ours) measures only the tip-free view, whatever the mode; a with-tips view longer
than max_prompt_len is then kept whole (cutting it would change what the old log-prob conditions
on): P grows to fit it, so the padded width can exceed max_prompt_len by the tip blocks' length.

The prompt is left-padded to P and the response right-padded to R, so the response always sits in
the last R columns (rl/logprobs.response_logprobs relies on that). P and B are rounded up to a few
bucketed sizes so that the jitted update sees few distinct shapes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from empo2_jax.model.chat import chat_text
from empo2_jax.rl.packing import pack_views
from empo2_jax.tips import TIP_BLOCK_RE, strip_tips_messages

MODES = ("on", "on_tips", "off")
RATIO_VARIANTS = ("paper", "release")
PROMPT_LEN_CHECKS = ("both", "sampled", "tip_free")
LAYOUTS = ("packed", "turn")  # optim.layout
UPDATE_SHAPES = ("grow", "fit", "max")  # optim.update_shapes


@dataclasses.dataclass
class Turn:
  messages: list  # [{"role", "content"}], up to and including the last user message
  response: str  # the raw sampled text (what stays in the history)
  response_ids: list  # sampled token ids (including the stop token if it was sampled)
  sampler_logprobs: list  # one float per response id
  mode: str  # "on" | "on_tips" | "off": how this turn's rollout was drawn (docs/method.md §1)
  group_id: Hashable  # the variation's GRPO group: all turns of its n rollouts
  rollout_id: Hashable  # episode, unique in the batch
  step: int  # turn index within the episode
  episode_return: float  # the episode's return (final score)
  reward: float = 0.0  # this step's env reward (score delta)
  intrinsic: float = 0.0  # this step's memory reward r_int (0 without memory)
  obs_key: Hashable = ""  # the current observation, for GiGPO anchor states
  valid: bool = True  # the env accepted the raw action as-is (GiGPO's invalid-action penalty)
  # The temperature each response token was sampled at, where it differs per token; None: the
  # rollout temperature. The update's log-probs use it (1/T per token).
  token_temps: Optional[list] = None
  # > 0: the turn was sampled under another policy and its tokens take the shaped, unclipped loss
  # term -A * rho / (rho + shaping_gamma) (rl/losses.policy_loss); 0: the clipped surrogate.
  shaping_gamma: float = 0.0
  # This turn's advantage, set by the trainer once the iteration's advantages are computed (saved
  # with the episodes, data/trajectories.py); None: not trained on (evaluation, env_failed).
  advantage: Optional[float] = None
  # Set by the trainer after the update (train/view_metrics.attach): whether the low-probability
  # mask removed this sample, and its lowest old log-prob; None: not in the update's batch.
  lowprob_masked: Optional[bool] = None
  min_old_logp: Optional[float] = None
  # The teacher view (methods/ctx_distill.py, methods/opid.py): the chat WITH tips (a tip-free
  # turn's shadow-retrieved tips, or a hindsight tip) and, set by train/teacher.py before the
  # update, the response's log-probs after it under the weights the update starts from.
  teacher_messages: Optional[list] = None
  teacher_logprobs: Optional[list] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchConfig:
  """Built by name in train/settings.batch_config; only what the config does not hold has a
  default."""

  max_prompt_len: int  # longer prompts drop the sample (measured per prompt_len_check)
  prompt_len_check: str  # "both" every view used; "sampled" as sampled + response; "tip_free"
  response_len: int  # R; longer responses drop the sample
  ratio_variant: str  # "paper" | "release"
  micro_rows: int  # B is a bucket over multiples of this (the update's micro-batch rows)
  prompt_multiple: int = 128  # P is a bucket over multiples of this
  bucket_growth: float = 1.25  # consecutive bucket sizes differ by at most this factor
  pad_id: int = 151643  # <|endoftext|>
  # optim.layout: "turn" (build_batch, one row per turn sample) or "packed" (build_packed_batch,
  # one row per episode and view)
  layout: str = "turn"
  # optim.update_shapes: "grow" (pad to the largest update shape so far), "fit" (the smallest
  # buckets each iteration), "max" (the largest the config allows, from the first iteration)
  update_shapes: str = "grow"

  def __post_init__(self):
    # The only check of these keys (train/build.check_config builds this object).
    if self.layout not in LAYOUTS:
      raise ValueError(
        f"optim.layout={self.layout!r}; valid: packed (one row per episode and view), turn "
        "(one row per turn sample)"
      )
    if self.update_shapes not in UPDATE_SHAPES:
      raise ValueError(
        f"optim.update_shapes={self.update_shapes!r}; valid: grow (pad to the largest update "
        "shape so far), fit (the smallest buckets each iteration), max (the largest the config "
        "allows, from the first iteration)"
      )
    if self.ratio_variant not in RATIO_VARIANTS:
      raise ValueError(
        f"empo2.ratio_variant={self.ratio_variant!r}; valid: {', '.join(RATIO_VARIANTS)}"
      )
    if self.prompt_len_check not in PROMPT_LEN_CHECKS:
      raise ValueError(
        f"optim.prompt_len_check={self.prompt_len_check!r}; valid: {', '.join(PROMPT_LEN_CHECKS)}"
      )
    if self.bucket_growth <= 1.0:
      raise ValueError(f"bucket_growth must be > 1, got {self.bucket_growth}")


def prompt_text(tokenizer, messages) -> str:
  """The ChatML prompt the sampler sees (model/chat.py: the actor tokenises the same text)."""
  return chat_text(tokenizer, messages, add_generation_prompt=True)


def views_for(mode: str, ratio_variant: str):
  """(current-view, old-view) names for a turn's mode, per the table above."""
  if mode not in MODES:
    raise ValueError(f"turn mode must be one of {MODES}, got {mode!r}")
  if mode != "off":
    return "tips", "tips"
  return ("notips", "notips") if ratio_variant == "paper" else ("notips", "tips")


def bucket_size(n: int, multiple: int, growth: float) -> int:
  """Smallest multiple * ceil(growth^k) >= n: few distinct sizes, at most ~growth overhead."""
  units = max(1, math.ceil(n / multiple))
  size, k = 1, 0
  while size < units:
    k += 1
    size = max(size + 1, math.ceil(growth**k))
  return size * multiple


def _tokenize_views(tokenizer, turns, needed):
  """{(i, view): prompt ids} for the (turn, view) pairs in `needed`, in one batched call."""
  keys = sorted(needed, key=lambda k: (k[0], k[1]))
  texts = []
  for i, view in keys:
    msgs = turns[i].messages if view == "tips" else strip_tips_messages(turns[i].messages)
    texts.append(prompt_text(tokenizer, msgs))
  ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
  return dict(zip(keys, ids))


def _select(turns: Sequence[Turn], advantages, tokenizer, cfg: BatchConfig):
  """(advantages [N], view plan, {(i, view): prompt ids}, kept turn indices, stats): the prompt
  views every turn needs, tokenised, and the turns that pass the length checks."""
  advantages = np.asarray(advantages, np.float32)
  if len(advantages) != len(turns):
    raise ValueError(f"{len(advantages)} advantages for {len(turns)} turns")
  plan = [views_for(t.mode, cfg.ratio_variant) for t in turns]
  needed = {(i, v) for i, views in enumerate(plan) for v in views}
  if cfg.prompt_len_check == "sampled":
    needed |= {(i, "tips") for i in range(len(turns))}
  if cfg.prompt_len_check == "tip_free":  # a turn without tip blocks: its "tips" view is tip-free
    needed |= {
      (i, "notips")
      for i, t in enumerate(turns)
      if any(TIP_BLOCK_RE.search(m["content"]) for m in t.messages)
    }
  ids = _tokenize_views(tokenizer, turns, needed)

  def checked_len(i):
    if cfg.prompt_len_check == "both":
      return max(len(ids[(i, v)]) for v in plan[i])
    if cfg.prompt_len_check == "sampled":
      return len(ids[(i, "tips")]) + len(turns[i].response_ids)
    return len(ids.get((i, "notips"), ids.get((i, "tips"))))

  keep, n_long_prompt, n_long_resp = [], 0, 0
  for i, t in enumerate(turns):
    if len(t.response_ids) != len(t.sampler_logprobs):
      raise ValueError(
        f"turn {i}: {len(t.response_ids)} response ids but "
        f"{len(t.sampler_logprobs)} sampler log-probs"
      )
    if len(t.response_ids) > cfg.response_len:
      n_long_resp += 1
    elif checked_len(i) > cfg.max_prompt_len:
      n_long_prompt += 1
    else:
      keep.append(i)
  stats = {
    "n_turns": len(turns),
    "n_dropped_prompt": n_long_prompt,
    "n_dropped_response": n_long_resp,
    "n_samples": len(keep),
  }
  return advantages, plan, ids, keep, stats


def build_batch(
  turns: Sequence[Turn],
  advantages,
  tokenizer,
  cfg: BatchConfig,
  num_rows: Optional[int] = None,
  min_len: int = 0,
) -> tuple[dict, dict[str, Any]]:
  """Turns + advantages [N] -> (batch dict of numpy arrays, stats), one row per turn.

  num_rows forces B (e.g. a fixed shape for AOT); otherwise B is bucketed. min_len: the token
  axis L is at least this (more left padding; the trainer's update_shapes="grow").
  stats: n_turns, n_dropped_prompt, n_dropped_response, n_samples, rows, prompt_len, tokens
  (real tokens of the current view: what the update's forward passes carry).
  """
  advantages, plan, ids, keep, stats = _select(turns, advantages, tokenizer, cfg)
  longest = max([len(ids[(i, v)]) for i in keep for v in plan[i]], default=1)
  p_len = min(
    bucket_size(longest, cfg.prompt_multiple, cfg.bucket_growth), max(cfg.max_prompt_len, longest)
  )
  p_len = max(p_len, min_len - cfg.response_len)
  rows = num_rows or bucket_size(max(len(keep), 1), cfg.micro_rows, cfg.bucket_growth)
  if rows < len(keep):
    raise ValueError(f"num_rows={rows} < {len(keep)} samples")
  R, L = cfg.response_len, p_len + cfg.response_len
  out = {
    "cur_tokens": np.full((rows, L), cfg.pad_id, np.int32),
    "cur_attn": np.zeros((rows, L), np.int32),
    "old_tokens": np.full((rows, L), cfg.pad_id, np.int32),
    "old_attn": np.zeros((rows, L), np.int32),
    "response_mask": np.zeros((rows, R), np.float32),
    "sampler_logp": np.zeros((rows, R), np.float32),
    "advantages": np.zeros((rows,), np.float32),
    "sample_index": np.full((rows,), -1, np.int32),
  }
  for row, i in enumerate(keep):
    t = turns[i]
    resp = np.asarray(t.response_ids, np.int32)
    for prefix, view in zip(("cur", "old"), plan[i]):
      p = ids[(i, view)]
      out[f"{prefix}_tokens"][row, p_len - len(p) : p_len] = p
      out[f"{prefix}_attn"][row, p_len - len(p) : p_len + len(resp)] = 1
      out[f"{prefix}_tokens"][row, p_len : p_len + len(resp)] = resp
    out["response_mask"][row, : len(resp)] = 1.0
    out["sampler_logp"][row, : len(resp)] = t.sampler_logprobs
    out["advantages"][row] = advantages[i]
    out["sample_index"][row] = i
  _optional_arrays(out, [[i] for i in keep], turns, (rows,), R)
  stats.update(rows=rows, prompt_len=p_len, tokens=int(out["cur_attn"].sum()))
  return out, stats


def _optional_arrays(out: dict, members: list, turns: Sequence[Turn], lead: tuple, R: int) -> None:
  """Adds token_temperature (lead + (R,)), shaping_gamma (lead) and teacher_logp (lead + (R,)) with
  teacher_mask (lead) when some kept turn has them.
  members[b]: the turn indices of row b (one per turn layout, the packed turns otherwise)."""
  kept = [i for m in members for i in m]
  if any(turns[i].token_temps is not None for i in kept):
    arr = np.zeros(lead + (R,), np.float32)
    for b, m in enumerate(members):
      for k, i in enumerate(m):
        temps = turns[i].token_temps
        if temps is None:
          continue
        if len(temps) != len(turns[i].response_ids):
          raise ValueError(
            f"turn {i}: {len(temps)} token temperatures for {len(turns[i].response_ids)} ids"
          )
        at = (b, k) if len(lead) == 2 else (b,)
        arr[at + (slice(0, len(temps)),)] = temps
    out["token_temperature"] = arr
  if any(turns[i].shaping_gamma > 0 for i in kept):
    arr = np.zeros(lead, np.float32)
    for b, m in enumerate(members):
      for k, i in enumerate(m):
        arr[(b, k) if len(lead) == 2 else b] = float(turns[i].shaping_gamma)
    out["shaping_gamma"] = arr
  if any(turns[i].teacher_logprobs is not None for i in kept):
    logp, has = np.zeros(lead + (R,), np.float32), np.zeros(lead, np.float32)
    for b, m in enumerate(members):
      for k, i in enumerate(m):
        lps = turns[i].teacher_logprobs
        if lps is None:
          continue
        if len(lps) != len(turns[i].response_ids):
          raise ValueError(
            f"turn {i}: {len(lps)} teacher log-probs for {len(turns[i].response_ids)} ids"
          )
        at = (b, k) if len(lead) == 2 else (b,)
        logp[at + (slice(0, len(lps)),)] = lps
        has[at] = 1.0
    out["teacher_logp"], out["teacher_mask"] = logp, has


def build_packed_batch(
  turns: Sequence[Turn],
  advantages,
  tokenizer,
  cfg: BatchConfig,
  num_rows: Optional[int] = None,
  min_len: int = 0,
  min_turns: int = 0,
) -> tuple[dict, dict[str, Any]]:
  """Turns + advantages [N] -> (batch, stats) in the episode-packed layout (rl/packing.py).

  The kept turns of one episode (same rollout_id, in step order) share a row per view as long as
  every view's next prompt extends the row (rl/packing.pack_views); where it does not (the
  history was re-tokenised differently or truncated) the turn starts a new row. Tokens are
  right-padded to L (bucketed, >= min_len); per-turn arrays gain a turn axis T (bucketed,
  >= min_turns):
    cur_tokens, cur_attn, old_tokens, old_attn  [B, L]
    cur_starts, old_starts                      [B, T] int32  first response position of a turn
    response_mask, sampler_logp                 [B, T, R]
    advantages [B, T] float32; sample_index [B, T] int32 (-1: no turn)
    token_temperature [B, T, R], shaping_gamma [B, T], teacher_logp [B, T, R], teacher_mask
    [B, T]  only when some turn has them (see above)
  A batch of build_batch is the special case T = 1, starts = L - R (rl/update.as_packed).
  """
  advantages, plan, ids, keep, stats = _select(turns, advantages, tokenizer, cfg)
  episodes: dict = {}
  for i in keep:
    episodes.setdefault(turns[i].rollout_id, []).append(i)
  packed = []  # (turn indices, cur PackedRow, old PackedRow)
  for members in episodes.values():
    members.sort(key=lambda i: turns[i].step)
    views = {
      "cur": [ids[(i, plan[i][0])] for i in members],
      "old": [ids[(i, plan[i][1])] for i in members],
    }
    for row in pack_views(views, [turns[i].response_ids for i in members]):
      packed.append(([members[t] for t in row["cur"].turn_ids], row["cur"], row["old"]))
  R = cfg.response_len
  longest = max([len(r.tokens) for _, c, o in packed for r in (c, o)], default=1)
  L = max(bucket_size(longest, cfg.prompt_multiple, cfg.bucket_growth), min_len)
  T = max(
    bucket_size(max([len(m) for m, _, _ in packed], default=1), 1, cfg.bucket_growth), min_turns
  )
  rows = num_rows or bucket_size(max(len(packed), 1), cfg.micro_rows, cfg.bucket_growth)
  if rows < len(packed):
    raise ValueError(f"num_rows={rows} < {len(packed)} packed rows")
  out = {
    "cur_tokens": np.full((rows, L), cfg.pad_id, np.int32),
    "cur_attn": np.zeros((rows, L), np.int32),
    "old_tokens": np.full((rows, L), cfg.pad_id, np.int32),
    "old_attn": np.zeros((rows, L), np.int32),
    "cur_starts": np.ones((rows, T), np.int32),
    "old_starts": np.ones((rows, T), np.int32),
    "response_mask": np.zeros((rows, T, R), np.float32),
    "sampler_logp": np.zeros((rows, T, R), np.float32),
    "advantages": np.zeros((rows, T), np.float32),
    "sample_index": np.full((rows, T), -1, np.int32),
  }
  for b, (members, cur, old) in enumerate(packed):
    for prefix, row in (("cur", cur), ("old", old)):
      out[f"{prefix}_tokens"][b, : len(row.tokens)] = row.tokens
      out[f"{prefix}_attn"][b, : len(row.tokens)] = 1
      out[f"{prefix}_starts"][b, : len(row.spans)] = [start for start, _ in row.spans]
    for k, i in enumerate(members):
      n = len(turns[i].response_ids)
      out["response_mask"][b, k, :n] = 1.0
      out["sampler_logp"][b, k, :n] = turns[i].sampler_logprobs
      out["advantages"][b, k] = advantages[i]
      out["sample_index"][b, k] = i
  _optional_arrays(out, [m for m, _, _ in packed], turns, (rows, T), R)
  stats.update(
    rows=rows,
    prompt_len=L,
    turns_per_row=T,
    packed_rows=len(packed),
    tokens=int(out["cur_attn"].sum()),
  )
  return out, stats
