"""Multi-turn sampling sessions: rows keep their KV cache between calls and prefill only new tokens.

A `Session` owns `num_rows` cache slots of `max_tokens` tokens each (plus `max_chunk` slots of
headroom for padded prefill writes). The actor maps each running episode to a slot and, once per
env step, calls

    out = session.step({slot: full_chat_token_ids, ...}, max_new_tokens=32, temperature=1.0,
                       top_p=1.0, top_k=0, stop_ids=stop_ids(tok), rng=key)
    tokens, logprobs = out[slot]

with the FULL token history of every slot that needs an action (the chat so far, ending with the
assistant header). Slots left out of the call are untouched and do not advance. Each call:
  1. Prefix check: the row's cached tokens (last history + the response minus its last token, which
     was never fed back) are compared with the new history. The longest common prefix stays in the
     cache and only the rest is prefilled. The usual case is a pure extension (response + next user
     message); if an earlier message changed (e.g. tips rewritten) the row rolls back to the first
     differing token, and a different episode in the slot shares (almost) nothing and is prefilled
     from scratch. Correct because attention only reads slots below each row's length.
  2. Capacity policy (never fails for a legal call): when history + max_new_tokens would exceed
     `max_tokens`, the row switches to a truncated view history[:keep] + history[cut:], keeping the
     first `keep` tokens (`keep_prefix`, per call or per session: e.g. the first user message) and
     the most recent ones, with `truncate_slack` tokens of spare room so that the next turns can
     extend the truncated view instead of truncating again. Later histories that extend the original
     keep the same cut; the view is re-cut once it fills again. Positions are those of the view
     (contiguous), as if the dropped middle never existed. Counted in `stats["truncations"]`.
  3. One jitted decode over all slots (inactive ones are masked), one key per slot:
     fold_in(rng, slot).
Rows finish independently: an episode that ended is simply not passed again; `release(slot)`
forgets its cache so a new episode can take the slot (passing a new episode's history without
releasing also works: the prefix check re-prefills it).

`reuse_prefix=False` re-prefills every active row's full (view) history on every call: the
reference path for tests and benchmarks. `stats` counts prefill tokens (real and padded), reused
tokens, rollbacks, resets, truncations and generated tokens.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Optional, Sequence

import numpy as np

import jax

from empo2_jax.model.configs import LlamaConfig
from empo2_jax.sampling.sampler import Engine, SamplerSettings, get_engine, row_keys


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  if n == 0:
    return 0
  diff = a[:n] != b[:n]
  i = int(np.argmax(diff))
  return i if diff[i] else n


@dataclasses.dataclass
class _Row:
  view: np.ndarray  # tokens held in cache slots [0, len(view))
  source: np.ndarray  # the untruncated history those slots stand for
  keep: int = 0  # view == source[:keep] + source[cut:] when truncated (cut > keep)
  cut: int = 0

  @property
  def truncated(self) -> bool:
    return self.cut > self.keep


def _empty_row() -> _Row:
  return _Row(np.zeros(0, np.int32), np.zeros(0, np.int32))


class Session:
  """Cache slots for multi-turn episodes; see the module docstring."""

  def __init__(
    self,
    params,
    config: LlamaConfig,
    *,
    num_rows: int,
    max_tokens: int,
    settings: SamplerSettings = SamplerSettings(),
    keep_prefix: int = 0,
    truncate_slack: Optional[int] = None,
    reuse_prefix: bool = True,
    mesh: Optional[jax.sharding.Mesh] = None,
    engine: Optional[Engine] = None,
  ):
    if num_rows < 1 or max_tokens < 2:
      raise ValueError(f"need num_rows >= 1 and max_tokens >= 2; got {num_rows}, {max_tokens}")
    self.config = config
    self.engine = engine or get_engine(config, settings, mesh)
    self.params = self.engine.prepare(params)
    self.num_rows, self.max_tokens = num_rows, max_tokens
    self.keep_prefix = keep_prefix
    self.truncate_slack = max_tokens // 4 if truncate_slack is None else truncate_slack
    self.reuse_prefix = reuse_prefix
    self.cache = self.engine.new_cache(num_rows, max_tokens + self.engine.settings.max_chunk)
    self.hidden = self.engine.new_hidden(num_rows)
    self.rows = [_empty_row() for _ in range(num_rows)]
    self.stats: collections.Counter = collections.Counter()

  def release(self, slot: int) -> None:
    """Forget a finished episode; the slot's next history is prefilled from scratch."""
    self.rows[slot] = _empty_row()

  def cached_length(self, slot: int) -> int:
    return len(self.rows[slot].view)

  def _view(self, row: _Row, hist: np.ndarray, max_new: int, keep: int) -> tuple[np.ndarray, _Row]:
    """The tokens the model should see for `hist`, and the row's new truncation state."""
    state = _Row(row.view, hist, 0, 0)
    if row.truncated and common_prefix(hist, row.source) >= row.cut:
      state.keep, state.cut = row.keep, row.cut
    view = np.concatenate([hist[: state.keep], hist[state.cut :]]) if state.truncated else hist
    room = self.max_tokens - max_new
    if len(view) <= room:
      return view, state
    keep = min(keep, room - 1)
    tail = max(1, room - keep - self.truncate_slack)
    state.keep, state.cut = keep, len(hist) - tail
    self.stats["truncations"] += 1
    return np.concatenate([hist[:keep], hist[state.cut :]]), state

  def step(
    self,
    requests: Mapping[int, Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_ids: Sequence[int] = (),
    rng: jax.Array,
    keep_prefix: Optional[Mapping[int, int]] = None,
  ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Sample one response per requested slot: {slot: (tokens int32 [n], logprobs float32 [n])}."""
    if not requests:
      return {}
    if max_new_tokens >= self.max_tokens:
      raise ValueError(
        f"max_new_tokens={max_new_tokens} leaves no room for a prompt in "
        f"max_tokens={self.max_tokens}; build the Session with more max_tokens"
      )
    b = self.num_rows
    suffixes: list[Optional[np.ndarray]] = [None] * b
    start = np.array([len(r.view) for r in self.rows], np.int64)
    active = np.zeros(b, bool)
    pending = {}
    for slot, hist in requests.items():
      if not 0 <= slot < b:
        raise ValueError(f"slot {slot} out of range [0, {b})")
      hist = np.asarray(hist, np.int32)
      if hist.ndim != 1 or len(hist) == 0:
        raise ValueError(f"slot {slot}: history must be a non-empty 1-D token list")
      row = self.rows[slot]
      keep = (keep_prefix or {}).get(slot, self.keep_prefix)
      view, state = self._view(row, hist, max_new_tokens, keep)
      n = common_prefix(view, row.view) if self.reuse_prefix else 0
      n = min(n, len(view) - 1)  # at least one token to prefill: its logits start decode
      if 0 < len(row.view) and n < len(row.view):
        self.stats["rollbacks" if n else "resets"] += 1
      self.stats["reused_tokens"] += n
      self.stats["prefill_tokens"] += len(view) - n
      suffixes[slot], start[slot], active[slot] = view[n:], n, True
      pending[slot] = (view, state)

    self.cache, self.hidden, computed = self.engine.prefill(
      self.params, self.cache, self.hidden, suffixes, start
    )
    self.stats["prefill_computed"] += computed
    length = start + np.array([len(s) if s is not None else 0 for s in suffixes])
    keys = self.engine.place_rows(row_keys(rng, range(b)))
    self.cache, toks, lps, counts, lengths = self.engine.decode(
      self.params,
      self.cache,
      self.hidden,
      length,
      active,
      keys,
      max_new_tokens=max_new_tokens,
      temperature=temperature,
      top_p=top_p,
      top_k=top_k,
      stop_ids=stop_ids,
    )
    self.stats["calls"] += 1
    out = {}
    for slot, (view, state) in pending.items():
      new = toks[slot, : counts[slot]].copy()
      fed = new[:-1]  # the last sampled token is never written to cache
      state.view = np.concatenate([view, fed])
      state.source = np.concatenate([state.source, fed])
      assert lengths[slot] == len(state.view), (slot, lengths[slot], len(state.view))
      self.rows[slot] = state
      self.stats["generated_tokens"] += len(new)
      out[slot] = (new, lps[slot, : counts[slot]].copy())
    return out
