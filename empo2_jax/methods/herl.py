"""HeRL adapted to agents (docs/methods.md §6): hindsight guidance from a group's best failed
episode.

HeRL (`sikelifei/HeRL@c527572`) trains on rubric-graded answers: when no answer of a prompt's
group is perfect, the policy is shown its best failed answer with the satisfied and unmet
constraints and asked to revise it; the revision joins the group with an off-policy token weight,
and the original gets a bonus for how much the revision improved on it. Here (the adaptation is a
proposal, docs/methods.md §6.3's note):

  candidate   per group with no successful episode, the best failed episode: the highest score,
              ties to the lowest rollout index. [proposed: HeRL rewrites every candidate tied for
              the best score, up to candidate_limit = 16; one per group keeps the cost at one
              extra episode per failing group]
  hindsight   the unmet goal items of that episode, the ones it reached, and its actions, in a
              <hindsight> block of the first user message of a new episode on the same variation
              (HeRL's `train_use_rewrite_prompt=True`: the guided sample is trained under the
              prompt it was sampled with). ScienceWorld: the simulator's subgoals
              (`getGoalProgressStr`, parsed by `parse_goal_progress`) not completed; the puzzles:
              "reach the goal" plus how the attempt ended.
  re-rollout  one guided episode per failing group with the current policy at temperature 0.3
              (HeRL's rewrite temperature)
  bonus       the candidate's score += alpha * (guided score - candidate score), alpha = 0.05
              (may be negative)
  injection   a uniformly random slot of the group is overwritten: by the guided episode if its
              score >= the group's best original score (HeRL: > first, then >=), marked as HE;
              otherwise by a copy of the best original episode (HeRL's fallback, not HE)
  HE weight   on HE tokens the PPO-clip term is replaced by -A * w, w = rho / (rho + gamma_s),
              rho = exp(clamp(log pi_theta - log pi_old, -20, 20)) with pi_old recomputed on the
              injected sample before the update, gamma_s = 1 (HeRL's IF setting); no clipping.
              The injected turns carry Turn.shaping_gamma = gamma_s (HeRL below), which
              the loss reads as its policy-shaping constant (rl/losses.shaped_ratio)
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Optional, Sequence

import numpy as np

import jax

from empo2_jax.config_keys import by_name
from empo2_jax.methods.base import GRPO_OVERRIDES, Plugin, register
from empo2_jax.text import parse_goal_progress

# The `herl` config section's defaults (the base config's; the settings dataclass's below).
# [proposed]: a proposal of docs/methods.md, not a value found in the authors' code.
SECTION = dict(
  enabled=False,
  alpha=0.05,  # reward_shaping_alpha (HeRL scripts)
  gamma_s=1.0,  # he_shaping_gamma (HeRL's IF script)
  temperature=0.3,  # the rewrite temperature (HeRL scripts)
  max_actions_shown=12,  # [proposed] the failed attempt's last actions in the hindsight block
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeRLConfig:
  """The `herl` section by name (HeRL.settings); its defaults are the section's (SECTION)."""

  alpha: float = SECTION["alpha"]  # reward_shaping_alpha
  gamma_s: float = SECTION["gamma_s"]  # he_shaping_gamma (IF: 1, medical: 0.1)
  temperature: float = SECTION["temperature"]  # the guided re-rollout's sampling temperature
  # the failed attempt's last actions shown in the hindsight block
  max_actions_shown: int = SECTION["max_actions_shown"]

  def __post_init__(self):
    if self.gamma_s <= 0 or self.temperature < 0 or self.max_actions_shown < 0:
      raise ValueError(
        f"herl: need gamma_s > 0, temperature >= 0, max_actions_shown >= 0; got "
        f"gamma_s={self.gamma_s}, temperature={self.temperature}, "
        f"max_actions_shown={self.max_actions_shown}"
      )


# ---------------------------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------------------------


def bonus(candidate_score: float, guided_score: float, alpha: float) -> float:
  """alpha * (guided - candidate): the candidate's improvement potential (may be negative)."""
  return float(alpha) * (float(guided_score) - float(candidate_score))


@dataclasses.dataclass(frozen=True)
class Member:
  """One episode of a group as HeRL sees it."""

  index: int  # position in the rollout's episode list
  score: float
  success: bool


def candidates(groups: dict) -> dict:
  """{group_id: index of the best failed episode} for every group without a successful episode.

  groups: {group_id: [Member, ...]} (members in rollout order). Ties go to the lowest index."""
  out = {}
  for gid, members in groups.items():
    if not members or any(m.success for m in members):
      continue
    best = max(members, key=lambda m: (m.score, -m.index))
    out[gid] = best.index
  return out


def injection(
  members: Sequence[Member], guided_score: float, rng: np.random.Generator
) -> tuple[int, bool, int]:
  """(slot, use_guided, source): the group member to overwrite (uniform), whether the guided
  episode goes there (its score >= the best original score) and, if not, the index of the best
  original episode copied there instead."""
  slot = members[int(rng.integers(len(members)))].index
  best = max(members, key=lambda m: (m.score, -m.index))
  use = float(guided_score) >= best.score
  return slot, use, best.index


# ---------------------------------------------------------------------------------------------
# Goal items and the hindsight text
# ---------------------------------------------------------------------------------------------


def hindsight_block(
  score_text: str,
  unmet: Sequence[str],
  met: Sequence[str] = (),
  actions: Sequence[str] = (),
  max_actions: int = 12,
) -> str:
  """The guidance shown to the re-rollout: the failed attempt, its reached and unmet goals."""
  lines = ["<hindsight>", f"An earlier attempt at this task failed (score {score_text})."]
  if actions:
    shown = list(actions)[-max_actions:] if max_actions else []
    cut = len(actions) - len(shown)
    head = f"Its last {len(shown)} of {len(actions)} actions" if cut else "Its actions"
    if shown:
      lines.append(f"{head}: " + "; ".join(a.strip() for a in shown) + ".")
  if met:
    lines.append("Goals it reached: " + "; ".join(met) + ".")
  lines.append("Goals it did not reach: " + ("; ".join(unmet) if unmet else "unknown") + ".")
  lines.append("Keep what worked and reach the goals it did not reach.")
  lines.append("</hindsight>")
  return "\n".join(lines) + "\n"


def goal_items(goal_progress: str, success: bool, outcome: str = "") -> tuple[list, list]:
  """(unmet, met) goal descriptions of a finished episode.

  goal_progress: ScienceWorld's goal progress text (parsed), or "" for an environment without
  subgoals (the puzzles), where the one goal is reaching the goal state; `outcome` (e.g. "fell
  into a hole") is added to the unmet item."""
  items = parse_goal_progress(goal_progress) if goal_progress else []
  if items:
    return [d for d, done in items if not done], [d for d, done in items if done]
  if success:
    return [], ["reach the goal"]
  return ["reach the goal" + (f" (the attempt {outcome})" if outcome else "")], []


def add_hindsight(first_user_message: str, block: str) -> str:
  """The first user message with the hindsight block in front (the rest unchanged)."""
  return block + "\n" + first_user_message


def shift_scores(
  returns: Sequence[float], rewards: Sequence[float], delta: float
) -> tuple[list, list]:
  """An episode's per-turn (episode_return, reward) with a score change `delta`: every turn's
  episode return moves by delta (grpo_step / gigpo scores) and the last turn's reward by delta
  (grpo_rollout sums rewards), so the episode's score changes by exactly delta in every
  estimator."""
  new_returns = [float(r) + delta for r in returns]
  new_rewards = [float(r) for r in rewards]
  if new_rewards:
    new_rewards[-1] += delta
  return new_returns, new_rewards


def summary(groups_failed: int, injected: int, fallback: int, bonuses: Optional[list]) -> dict:
  """Metrics of one iteration's HeRL step."""
  return {
    "herl/groups_failed": int(groups_failed),
    "herl/injected": int(injected),
    "herl/fallback_copies": int(fallback),
    "herl/bonus_mean": float(np.mean(bonuses)) if bonuses else 0.0,
  }


# -- the plugin: what HeRL adds to the trainer --
class HeRL(Plugin):
  """After the rollout: guided re-rollouts of the groups without a success, the bonus and the
  injection; the injected turns have Turn.shaping_gamma = herl.gamma_s."""

  name, section = "herl", SECTION
  sampler_logprobs = False  # guided samples at herl.temperature, under another prompt
  exclusive = True

  @classmethod
  def settings(cls, c) -> HeRLConfig:
    return by_name(HeRLConfig, c.herl)

  @classmethod
  def check(cls, c) -> None:
    cls.settings(c)

  def __init__(self, c, **kw):
    super().__init__(c, **kw)
    self.cfg = self.settings(c)

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    t0 = time.perf_counter()
    episodes, m = self._guide(ctx, episodes, iteration, key)
    m["time/herl"] = time.perf_counter() - t0
    return episodes, m

  def _guide(self, ctx, episodes, iteration: int, key):
    cfg = self.cfg
    groups: dict = {}
    for i, e in enumerate(episodes):
      if not e.env_failed:
        groups.setdefault(e.group_id, []).append(Member(i, e.score, e.success))
    cands = candidates(groups)
    if not cands:
      return episodes, summary(0, 0, 0, [])
    order = sorted(cands, key=lambda g: cands[g])
    specs, notes = [], []
    for gid in order:
      e = episodes[cands[gid]]
      outcome = "ran out of steps" if e.truncated else "ended without reaching it"
      unmet, met = goal_items(e.goals, e.success, outcome)
      notes.append(
        hindsight_block(
          self.score_text(e.score),
          unmet,
          met,
          [a for a in e.executed if a.strip()],  # turns that named no action executed nothing
          cfg.max_actions_shown,
        )
      )
      specs.append((e.task, e.variation, gid))
    rollout = ctx.rollout(
      specs, notes=notes, temperature=cfg.temperature, rng=jax.random.fold_in(key, 1)
    )
    rollout.close()  # no tips are written from the guided episodes
    guided = rollout.episodes
    rng = np.random.default_rng([ctx.seed, iteration, 1931])
    episodes = list(episodes)
    injected = fallback = 0
    bonuses = []
    for gid, g in zip(order, guided):
      cand = episodes[cands[gid]]
      if g.env_failed:
        continue
      original = copy.deepcopy(cand)
      delta = bonus(cand.score, g.score, cfg.alpha)
      bonuses.append(delta)
      _shift(cand, delta)
      slot, use, src = injection(groups[gid], g.score, rng)
      target = episodes[slot]
      new = g if use else (original if src == cands[gid] else copy.deepcopy(episodes[src]))
      _relabel(new, target.group_id, target.rollout_id, cfg.gamma_s if use else 0.0)
      episodes[slot] = new
      injected += int(use)
      fallback += int(not use)
    m = summary(len(cands), injected, fallback, bonuses)
    ok = [g for g in guided if not g.env_failed]
    m["herl/guided_score_mean"] = float(np.mean([g.score for g in ok])) if ok else 0.0
    m["herl/guided_success"] = float(np.mean([g.success for g in ok])) if ok else 0.0
    return episodes, m


def _shift(e, delta: float) -> None:
  """The episode's score moves by delta in every advantage estimator (shift_scores)."""
  returns, rewards = shift_scores(
    [t.episode_return for t in e.turns], [t.reward for t in e.turns], delta
  )
  for t, r, w in zip(e.turns, returns, rewards):
    t.episode_return, t.reward = r, w  # the training signal; e.score stays the env's score


def _relabel(e, group_id, rollout_id, shaping_gamma: float) -> None:
  """The episode moved into another slot; shaping_gamma > 0 marks its turns as sampled under
  another policy (the HE weight)."""
  e.group_id, e.rollout_id = group_id, rollout_id
  e.turns = [
    dataclasses.replace(t, group_id=group_id, rollout_id=rollout_id, shaping_gamma=shaping_gamma)
    for t in e.turns
  ]


register(
  "herl",
  "HeRL: guided re-rollouts of failed groups from their unmet goals, injected with the HE token "
  "weight and the bonus; GRPO, no memory (methods/herl.py)",
  overrides={**GRPO_OVERRIDES, "herl.enabled": True},
  label="HeRL",
  plugin=HeRL,
)


__all__ = [
  "HeRL",
  "SECTION",
  "HeRLConfig",
  "Member",
  "bonus",
  "candidates",
  "injection",
  "goal_items",
  "hindsight_block",
  "add_hindsight",
  "shift_scores",
  "summary",
]
