"""SGE, strategy-guided exploration (Szot et al. 2026; docs/methods.md §5), as a method of this
trainer.

No code of the authors was found; everything below is docs/methods.md §5.3's proposal (mark it as
such in reports):

  format      each turn: "<strategy> one or two sentences </strategy>" then the action. The
              instruction is added to the first user message (`STRATEGY_INSTRUCTION`).
  mixed T     rollout j of a group samples its strategy span at T_s[j], the rest of the turn at
              T_a (the rollout temperature): T_s = 1.0 for the first half of the group, 1.3 for
              the next quarter, 1.6 for the last quarter (`group_temperatures`). Sampling is two
              calls per step (`sample_with_strategy`): the strategy phase (at most
              strategy_max_new_tokens, per temperature class) is cut after the token that closes
              `</strategy>`, then the action phase continues the same cached row at T_a.
  log-probs   every response token records the temperature it was drawn at (Turn.token_temps);
              the update's old and current log-probs use softmax(logits / T_token), so the PPO
              ratio compares the policy at the temperature that produced the token
              (rl/logprobs.token_logprobs(inv_temperature=...)). With one temperature for the
              old and another for the new log-prob the ratio would be biased.
  reflection  from the second iteration on, a share rho = 0.5 of each group's rollouts (spread
              over the temperature classes, `reflects`) gets "Previous strategies for this task
              and their outcomes: - <strategy> -> success/fail, score" for the last M = 3
              distinct strategies stored for the variation, and "Propose a different strategy
              likely to succeed."; these rollouts are trained as on-policy under the prompt they
              saw (reflection text included).
  book        the first strategy of every finished training episode and its outcome, per
              (task, variation), in `StrategyBook` (checkpointed with the trainer).
  evaluation  no reflection, one temperature (train.eval_temperature), the strategy format kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable, Optional, Sequence

import numpy as np

import jax

from empo2_jax.config_keys import by_name
from empo2_jax.methods.base import GRPO_OVERRIDES, Plugin, register

# The `sge` config section's defaults (the base config's; the settings dataclass's below).
# [proposed]: a proposal of docs/methods.md, not a value found in the authors' code.
SECTION = dict(
  enabled=False,
  # [proposed] temperature:share classes of a group's strategy spans (docs/methods.md §5.3)
  strategy_temperatures="1.0:0.5,1.3:0.25,1.6:0.25",
  # [proposed] the strategy phase's token budget, ADDED to rollout.max_new_tokens
  strategy_max_new_tokens=32,
  reflect_share=0.5,  # [proposed] rho
  reflect_history=3,  # [proposed] M
  reflect_from_iteration=1,  # [proposed] reflection from the second iteration on
)


OPEN, CLOSE = "<strategy>", "</strategy>"
STRATEGY_INSTRUCTION = (
  "Before each action, first write a short strategy for making progress (one or two sentences) "
  f"between {OPEN} and {CLOSE}, then write the action."
)
_SPAN = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def parse_temperatures(text: str) -> tuple:
  """'1.0:0.5,1.3:0.25,1.6:0.25' (the config string) -> ((1.0, 0.5), (1.3, 0.25), (1.6, 0.25))."""
  out = []
  for part in text.split(","):
    t, sep, share = part.strip().partition(":")
    if not sep:
      raise ValueError(f"sge.strategy_temperatures: {part!r} is not 'temperature:share'")
    out.append((float(t), float(share)))
  return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGEConfig:
  """The `sge` section (SECTION, its defaults), by name (SGE.settings)."""

  # (temperature, share of the group) classes, in rollout order
  strategy_temperatures: tuple = parse_temperatures(SECTION["strategy_temperatures"])
  strategy_max_new_tokens: int = SECTION["strategy_max_new_tokens"]
  reflect_share: float = SECTION["reflect_share"]
  reflect_history: int = SECTION["reflect_history"]  # M: distinct earlier strategies shown
  # 0-based: the second iteration on
  reflect_from_iteration: int = SECTION["reflect_from_iteration"]

  def __post_init__(self):
    shares = [s for _, s in self.strategy_temperatures]
    if not shares or abs(sum(shares) - 1.0) > 1e-6 or min(shares) < 0:
      raise ValueError(f"sge strategy temperature shares must sum to 1, got {shares}")
    if min(t for t, _ in self.strategy_temperatures) <= 0:
      raise ValueError("sge strategy temperatures must be > 0")
    if not 0.0 <= self.reflect_share <= 1.0 or self.reflect_history < 1:
      raise ValueError(
        f"sge: need 0 <= reflect_share <= 1 and reflect_history >= 1; got "
        f"{self.reflect_share}, {self.reflect_history}"
      )
    if self.strategy_max_new_tokens < 1:
      raise ValueError("sge.strategy_max_new_tokens must be >= 1")


def group_temperatures(group_size: int, classes: Sequence) -> list[float]:
  """The strategy temperature of each rollout of a group: rollout j takes the class whose
  cumulative share interval holds (j + 0.5) / G (G = 8: 4 x 1.0, 2 x 1.3, 2 x 1.6)."""
  bounds = np.cumsum([s for _, s in classes])
  out = []
  for j in range(group_size):
    q = (j + 0.5) / group_size
    k = int(np.searchsorted(bounds, q, side="left"))
    out.append(float(classes[min(k, len(classes) - 1)][0]))
  return out


def reflects(j: int, share: float) -> bool:
  """Whether rollout j of a group gets reflection: floor((j+1) s) > floor(j s), which spreads
  round(G s) reflected rollouts evenly over the group (s = 0.5: every second rollout)."""
  return int(np.floor((j + 1) * share + 1e-9)) > int(np.floor(j * share + 1e-9))


def split_strategy(text: str) -> tuple[str, str]:
  """(strategy, action text): the first <strategy>...</strategy> span and what follows it. An
  unclosed span is all strategy (nothing is left for the action); no span: ("", text)."""
  m = _SPAN.search(text)
  if m:
    return m.group(1).strip(), text[m.end() :].strip()
  start = text.find(OPEN)
  if start >= 0:
    return text[start + len(OPEN) :].strip(), text[:start].strip()
  return "", text.strip()


def close_cut(ids: Sequence[int], decode: Callable) -> Optional[int]:
  """The number of leading tokens whose text first contains </strategy>, or None."""
  for k in range(1, len(ids) + 1):
    if CLOSE in decode(list(ids[:k])):
      return k
  return None


def token_temperatures(n_strategy: int, n_action: int, t_s: float, t_a: float) -> list[float]:
  return [float(t_s)] * n_strategy + [float(t_a)] * n_action


def reflection_text(entries: Sequence[dict], score_text: Callable = str) -> str:
  """The reflection block for entries [{"strategy", "success", "score"}] (oldest first)."""
  lines = ["Previous strategies for this task and their outcomes:"]
  for e in entries:
    outcome = "success" if e["success"] else "fail"
    lines.append(f"- {e['strategy']} -> {outcome}, score {score_text(e['score'])}")
  lines.append("Propose a different strategy likely to succeed.")
  return "\n".join(lines) + "\n"


class StrategyBook:
  """Per (task, variation): the strategies tried and their outcomes, oldest first."""

  def __init__(self, max_per_key: int = 50):
    self.max_per_key = max_per_key
    self.entries: dict = {}

  def add(self, key, strategy: str, success: bool, score: float) -> None:
    strategy = " ".join(strategy.split())
    if not strategy:
      return
    kept = self.entries.setdefault(_key(key), [])
    kept.append({"strategy": strategy, "success": bool(success), "score": float(score)})
    del kept[: -self.max_per_key]

  def recent(self, key, m: int) -> list[dict]:
    """The last m DISTINCT strategies (the latest outcome of each), oldest first."""
    out, seen = [], set()
    for e in reversed(self.entries.get(_key(key), [])):
      if e["strategy"] in seen:
        continue
      seen.add(e["strategy"])
      out.append(e)
      if len(out) == m:
        break
    return out[::-1]

  def to_array(self) -> np.ndarray:
    """The book as uint8 JSON bytes (a checkpointable array; never empty)."""
    return np.frombuffer(json.dumps(self.entries, sort_keys=True).encode(), np.uint8).copy()

  @classmethod
  def from_array(cls, arr, max_per_key: int = 50) -> "StrategyBook":
    book = cls(max_per_key)
    book.entries = json.loads(np.asarray(arr, np.uint8).tobytes().decode())
    return book


def _key(key) -> str:
  return key if isinstance(key, str) else "|".join(str(k) for k in key)


def sample_with_strategy(
  sample: Callable,
  decode: Callable,
  requests: dict,
  strategy_temps: dict,
  key: jax.Array,
  *,
  strategy_max_new_tokens: int,
  max_new_tokens: int,
  action_temperature: float,
  stop_ids: Sequence[int],
) -> dict:
  """Two-phase sampling of one step. sample(requests, key, max_new_tokens, temperature) -> {i:
  (ids, logprobs)} is one sampler call over the rows in `requests` (the actor's session: rows
  keep their cache, so phase 2 prefills nothing but the cut point); decode(ids) -> text.

  Returns {i: (ids, logprobs, token temperatures, closed)}: the strategy phase at
  strategy_temps[i], cut after </strategy> (closed = True), then the action phase at
  action_temperature with the rest of the max_new_tokens budget. A row that stops (a stop id)
  inside its strategy phase ends there."""
  k1, k2 = jax.random.split(key)
  first = {}
  for t in sorted(set(strategy_temps[i] for i in requests)):
    rows = {i: ids for i, ids in requests.items() if strategy_temps[i] == t}
    first.update(sample(rows, k1, min(strategy_max_new_tokens, max_new_tokens), t))
  stops = set(int(s) for s in stop_ids)
  out, second = {}, {}
  for i, (ids, lps) in first.items():
    ids, lps = [int(x) for x in ids], [float(x) for x in lps]
    cut = close_cut(ids, decode)
    closed = cut is not None
    if cut is not None:
      ids, lps = ids[:cut], lps[:cut]
    out[i] = (ids, lps, [float(strategy_temps[i])] * len(ids), closed)
    if not (ids and ids[-1] in stops) and len(ids) < max_new_tokens:
      second[i] = list(requests[i]) + ids
  if second:
    budget = max_new_tokens - min(len(out[i][0]) for i in second)
    got = sample(second, k2, budget, action_temperature)
    for i, (ids2, lps2) in got.items():
      ids, lps, temps, closed = out[i]
      room = max_new_tokens - len(ids)
      ids2 = [int(x) for x in ids2][:room]
      lps2 = [float(x) for x in lps2][:room]
      out[i] = (ids + ids2, lps + lps2, temps + [float(action_temperature)] * len(ids2), closed)
  return out


# -- the plugin: what SGE adds to the trainer --
class SGE(Plugin):
  """notes: the strategy instruction and, for a share of the group, the reflection on the task
  row's earlier strategies; the two-phase sampler with per-rollout strategy temperatures
  (Turn.token_temps); after the rollout the first strategies go into the book; the env reads the
  text after </strategy>."""

  name, section = "sge", SECTION
  sampler_logprobs = False  # per-token temperatures
  exclusive = True

  @classmethod
  def settings(cls, c) -> SGEConfig:
    """The `sge` section by name, its temperature classes parsed."""
    return by_name(
      SGEConfig, c.sge, strategy_temperatures=parse_temperatures(c.sge.strategy_temperatures)
    )

  @classmethod
  def check(cls, c) -> None:
    cls.settings(c)

  @classmethod
  def extra_response_tokens(cls, c) -> int:
    return int(c.sge.strategy_max_new_tokens)

  def __init__(self, c, **kw):
    super().__init__(c, **kw)
    self.cfg = self.settings(c)
    self.group_size = int(c.rollout.group_size)
    self.book = StrategyBook()
    self._counts = {"turns": 0, "closed": 0}

  def env_text(self, response: str) -> str:
    return split_strategy(response)[1]

  def train_notes(self, specs: Sequence, iteration: int) -> list[str]:
    out = []
    for i, (task, variation, _) in enumerate(specs):
      note = STRATEGY_INSTRUCTION
      j = i % self.group_size
      if iteration >= self.cfg.reflect_from_iteration and reflects(j, self.cfg.reflect_share):
        entries = self.book.recent((task, int(variation)), self.cfg.reflect_history)
        if entries:
          note += "\n" + reflection_text(entries, self.score_text)
      out.append(note)
    return out

  def eval_notes(self, specs: Sequence) -> list[str]:
    """Evaluation: the strategy format without reflection."""
    return [STRATEGY_INSTRUCTION] * len(specs)

  def train_sampler(self):
    temps = group_temperatures(self.group_size, self.cfg.strategy_temperatures)
    cfg, counts, g = self.cfg, self._counts, self.group_size

    def sampler(actor, session, requests, key, episodes, *, temperature, keep_prefix):
      t_s = {i: temps[episodes[i].rollout_id % g] for i in requests}

      def sample(rows, k, n, t):
        return actor.sample(
          session, rows, k, max_new_tokens=n, temperature=t, keep_prefix=keep_prefix
        )

      got = sample_with_strategy(
        sample,
        lambda ids: actor.tok.decode(ids, skip_special_tokens=True),
        requests,
        t_s,
        key,
        strategy_max_new_tokens=cfg.strategy_max_new_tokens,
        max_new_tokens=actor.settings.max_new_tokens,
        action_temperature=temperature,
        stop_ids=actor.stop_ids,
      )
      counts["turns"] += len(got)
      counts["closed"] += sum(int(x[3]) for x in got.values())
      return {i: (np.asarray(ids), np.asarray(lps), temps_) for i, (ids, lps, temps_, _) in
              got.items()}  # fmt: skip

    return sampler

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    for e in episodes:
      if e.env_failed or not e.turns:
        continue
      strategy = split_strategy(e.turns[0].response)[0]
      self.book.add((e.task, e.variation), strategy, e.success, e.score)
    n, closed = self._counts["turns"], self._counts["closed"]
    self._counts.update(turns=0, closed=0)
    return episodes, {"sge/strategy_closed_frac": closed / n if n else 0.0}

  def meta(self) -> dict:
    return {"sge_book": self.book.entries}

  def load(self, tree, meta: dict) -> None:
    if "sge_book" in meta:
      self.book.entries = dict(meta["sge_book"])


register(
  "sge",
  "SGE: <strategy> spans sampled at mixed temperatures (log-probs at the temperature used), "
  "strategy reflection; GRPO, no memory (methods/sge.py)",
  overrides={**GRPO_OVERRIDES, "sge.enabled": True},
  label="SGE",
  plugin=SGE,
)


__all__ = [
  "SGE",
  "SECTION",
  "SGEConfig",
  "STRATEGY_INSTRUCTION",
  "StrategyBook",
  "parse_temperatures",
  "group_temperatures",
  "reflects",
  "split_strategy",
  "close_cut",
  "token_temperatures",
  "reflection_text",
  "sample_with_strategy",
]
