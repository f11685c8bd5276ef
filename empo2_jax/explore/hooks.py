"""The trainer's side of the exploration methods: one `Explorer` per run, built from the config.

    explorer = Explorer(config, encoder=memory_encoder, score_out_of=prompts.score_out_of)
    notes = explorer.train_notes(specs, iteration)          # first-message notes per episode
    sampler = explorer.train_sampler()                       # the actor's per-step sampler or None
    episodes, metrics = explorer.after_rollout(trainer, episodes, iteration, mode, key)
    actor = Actor(..., env_text=explorer.env_text)           # what of a response the env reads

What each method adds (its logic lives in its own module; this file only dispatches):
  rnd   after the rollout: every turn's current observation -> RND reward in Turn.intrinsic
        (explore/rnd.py); the networks are checkpointed (`state_tree` / `load`)
  sge   notes: the strategy instruction and, for a share of the group, the reflection on the
        task row's earlier strategies; the two-phase sampler with per-rollout strategy
        temperatures (Turn.token_temps); after the rollout the first strategies go into the book
        (explore/sge.py); the env reads the text after </strategy>
  herl  after the rollout: guided re-rollouts of the groups without a success, the bonus and the
        injection (explore/herl.py); the injected turns have Turn.shaping_gamma = herl.gamma_s
  spa   the env reads the <answer> span (explore/spa.py); stages A and B are launch/spa.py
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Optional, Sequence

import numpy as np

import jax

from empo2_jax.explore import config as xcfg
from empo2_jax.explore import herl, sge, spa


def _score_text(score: float, out_of) -> str:
  from empo2_jax.memory.reflect import format_score

  return f"{format_score(score)}/{format_score(out_of)}" if out_of else format_score(score)


class Explorer:
  def __init__(self, c, *, encoder=None, score_out_of=100):
    xcfg.check(c)
    self.c = c
    self.group_size = int(c.rollout.group_size)
    self.score_out_of = score_out_of
    self.kind = xcfg.intrinsic_kind(c)
    self.rnd = None
    if self.kind == "rnd":
      from empo2_jax.explore import rnd

      self.rnd = rnd.RND(xcfg.rnd_config(c), encoder)
    self.sge = xcfg.sge_config(c) if c.sge.enabled else None
    self.book = sge.StrategyBook()
    self.herl = xcfg.herl_config(c) if c.herl.enabled else None
    self._sge_counts = {"turns": 0, "closed": 0}

  # -- what the env reads of a response ---------------------------------------------------------
  def env_text(self, response: str) -> str:
    if self.sge is not None:
      return sge.split_strategy(response)[1]
    if self.c.spa.enabled:
      return spa.action_text(response)
    return response

  # -- notes opening the first user message ------------------------------------------------------
  def train_notes(self, specs: Sequence, iteration: int) -> Optional[list[str]]:
    if self.sge is None:
      return None
    out = []
    for i, (task, variation, _) in enumerate(specs):
      note = sge.STRATEGY_INSTRUCTION
      j = i % self.group_size
      if iteration >= self.sge.reflect_from_iteration and sge.reflects(j, self.sge.reflect_share):
        entries = self.book.recent((task, int(variation)), self.sge.reflect_history)
        if entries:
          score = lambda s: _score_text(s, self.score_out_of)  # noqa: E731
          note += "\n" + sge.reflection_text(entries, score)
      out.append(note)
    return out

  def eval_notes(self, specs: Sequence) -> Optional[list[str]]:
    """Evaluation: the strategy format without reflection (SGE); nothing for the others."""
    return [sge.STRATEGY_INSTRUCTION] * len(specs) if self.sge is not None else None

  # -- the actor's sampler -----------------------------------------------------------------------
  def train_sampler(self):
    """SGE's two-phase sampler for training rollouts (None: the actor's plain sampling)."""
    if self.sge is None:
      return None
    temps = sge.group_temperatures(self.group_size, self.sge.strategy_temperatures)
    cfg, counts = self.sge, self._sge_counts

    def sampler(actor, session, requests, key, episodes, *, temperature, keep_prefix):
      t_s = {i: temps[episodes[i].rollout_id % self.group_size] for i in requests}

      def sample(rows, k, n, t):
        return actor.sample(
          session, rows, k, max_new_tokens=n, temperature=t, keep_prefix=keep_prefix
        )

      got = sge.sample_with_strategy(
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
      counts["closed"] += sum(int(g[3]) for g in got.values())
      return {i: (np.asarray(ids), np.asarray(lps), temps_) for i, (ids, lps, temps_, _) in
              got.items()}  # fmt: skip

    return sampler

  # -- after the rollout ---------------------------------------------------------------------------
  def after_rollout(self, trainer, episodes: list, iteration: int, mode: str, key) -> tuple:
    """(episodes to train on, metrics). Runs on every host with the same gathered episodes."""
    metrics: dict = {}
    if self.sge is not None:
      metrics.update(self._sge_after(episodes))
    if self.herl is not None:
      t0 = time.perf_counter()
      episodes, m = self._herl_after(trainer, episodes, iteration, key)
      metrics.update(m)
      metrics["time/herl"] = time.perf_counter() - t0
    if self.rnd is not None:
      metrics.update(self._rnd_after(episodes, mode))
    return episodes, metrics

  def _rnd_after(self, episodes, mode: str) -> dict:
    turns = [t for e in episodes if not e.env_failed for t in e.turns]
    r = self.rnd.rewards(
      [t.obs_key or " " for t in turns], [t.rollout_id for t in turns], [t.step for t in turns]
    )
    give = self.c.rnd.rollouts == "all" or mode != "on"
    for t, x in zip(turns, r):
      t.intrinsic = float(x) if give else 0.0
    return dict(self.rnd.last_stats, **{"rnd/rewarded": int(give and len(turns) > 0)})

  def _sge_after(self, episodes) -> dict:
    for e in episodes:
      if e.env_failed or not e.turns:
        continue
      strategy = sge.split_strategy(e.turns[0].response)[0]
      self.book.add((e.task, e.variation), strategy, e.success, e.score)
    n, closed = self._sge_counts["turns"], self._sge_counts["closed"]
    self._sge_counts.update(turns=0, closed=0)
    return {"sge/strategy_closed_frac": closed / n if n else 0.0}

  def _herl_after(self, trainer, episodes, iteration: int, key) -> tuple:
    cfg = self.herl
    groups: dict = {}
    for i, e in enumerate(episodes):
      if not e.env_failed:
        groups.setdefault(e.group_id, []).append(herl.Member(i, e.score, e.success))
    cands = herl.candidates(groups)
    if not cands:
      return episodes, herl.summary(0, 0, 0, [])
    order = sorted(cands, key=lambda g: cands[g])
    specs, notes = [], []
    for gid in order:
      e = episodes[cands[gid]]
      outcome = "ran out of steps" if e.truncated else "ended without reaching it"
      unmet, met = herl.goal_items(e.goals, e.success, outcome)
      notes.append(
        herl.hindsight_block(
          _score_text(e.score, self.score_out_of),
          unmet,
          met,
          [a for a in e.executed if a.strip()],  # turns that named no action executed nothing
          cfg.max_actions_shown,
        )
      )
      specs.append((e.task, e.variation, gid))
    rollout = trainer.actor.rollout(
      trainer.sampling_params(),
      trainer.model_config,
      specs,
      use_memory=False,
      temperature=cfg.temperature,
      rng=jax.random.fold_in(key, 1),
      mode="on",
      notes=notes,
    )
    rollout.close()  # no tips are written from the guided episodes
    guided = rollout.episodes
    rng = np.random.default_rng([self.c.seed, iteration, 1931])
    episodes = list(episodes)
    injected = fallback = 0
    bonuses = []
    for gid, g in zip(order, guided):
      cand = episodes[cands[gid]]
      if g.env_failed:
        continue
      original = copy.deepcopy(cand)
      delta = herl.bonus(cand.score, g.score, cfg.alpha)
      bonuses.append(delta)
      _shift(cand, delta)
      slot, use, src = herl.injection(groups[gid], g.score, rng)
      target = episodes[slot]
      new = g if use else (original if src == cands[gid] else copy.deepcopy(episodes[src]))
      _relabel(new, target.group_id, target.rollout_id, cfg.gamma_s if use else 0.0)
      episodes[slot] = new
      injected += int(use)
      fallback += int(not use)
    m = herl.summary(len(cands), injected, fallback, bonuses)
    ok = [g for g in guided if not g.env_failed]
    m["herl/guided_score_mean"] = float(np.mean([g.score for g in ok])) if ok else 0.0
    m["herl/guided_success"] = float(np.mean([g.success for g in ok])) if ok else 0.0
    return episodes, m

  # -- checkpoint ----------------------------------------------------------------------------------
  def state_tree(self):
    """The arrays to checkpoint with the train state (RND), or None."""
    return self.rnd.state._asdict() if self.rnd is not None else None

  def meta(self) -> dict:
    """JSON-able state for the checkpoint's meta (SGE's strategy book)."""
    return {"sge_book": self.book.entries} if self.sge is not None else {}

  def load(self, tree, meta: Optional[dict]) -> None:
    if self.rnd is not None and tree is not None:
      from empo2_jax.explore import rnd

      d = dict(tree)
      d["obs"] = rnd.RunningStats(**dict(d["obs"])) if isinstance(d["obs"], dict) else d["obs"]
      d["ret"] = rnd.RunningStats(**dict(d["ret"])) if isinstance(d["ret"], dict) else d["ret"]
      self.rnd.state = rnd.RNDState(**d)
    if meta and "sge_book" in meta:
      self.book.entries = dict(meta["sge_book"])


def _shift(e, delta: float) -> None:
  """The episode's score moves by delta in every advantage estimator (herl.shift_scores)."""
  returns, rewards = herl.shift_scores(
    [t.episode_return for t in e.turns], [t.reward for t in e.turns], delta
  )
  for t, r, w in zip(e.turns, returns, rewards):
    t.episode_return, t.reward = r, w  # the training signal; e.score stays the env's score


def _relabel(e, group_id, rollout_id, shaping_gamma: float) -> None:
  """The episode moved into another slot; shaping_gamma > 0 marks its turns as sampled under
  another policy (the HE weight, explore/herl.py)."""
  e.group_id, e.rollout_id = group_id, rollout_id
  e.turns = [
    dataclasses.replace(t, group_id=group_id, rollout_id=rollout_id, shaping_gamma=shaping_gamma)
    for t in e.turns
  ]


__all__ = ["Explorer"]
