"""Retrospex at act time: the policy samples K candidate actions per step, the offline critic
re-scores them (baselines/retrospex.py), the chosen one goes to the environment.

    agent = RetrospexAgent(pool, tokenizer, materials, prompt_set, critic, RescoreConfig(),
                           settings=ActorSettings(...))
    episodes, stats = agent.run(params, model_config, specs, rng=key)  # Episodes, counts

Per step, every running episode's chat is sampled K times in one session call (K cache rows per
episode: the rows share the chat, so after the first step each row prefills only the new turn);
the K texts become candidates (distinct texts, top-k by mean token log-prob); with one candidate
it is taken, else p = exp(mean log-prob) and q = Q_target(task, obs, a) - V(task, obs) are
combined with lambda_t = max(b, d^t). The chat keeps the chosen text, and the env's answer enters
the episode as in the actor (agent/episode.reset_episodes, apply_step). Nothing updates the policy
or the critic. The same prompts as every other method (the env's PromptSet).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

import jax

from empo2_jax.agent.episode import ActorSettings, Episode, apply_step, reset_episodes
from empo2_jax.baselines import retrospex as R
from empo2_jax.baselines import retrospex_iql as iql
from empo2_jax.baselines.retrospex_data import DEFAULT_MAX_LEN, encode_fields
from empo2_jax.model.chat import ChatTokens
from empo2_jax.model.tokenizer import stop_ids
from empo2_jax.sampling.sampler import SamplerSettings
from empo2_jax.sampling.session import Session


@dataclasses.dataclass
class Critic:
  """A trained critic as retrospex_iql.load returns it, plus the text limits it was trained with."""

  nets: iql.Nets
  state: iql.IQLState
  tokenizer: object  # retrospex_data.Tokenizer
  max_len: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_MAX_LEN))

  def advantages(self, task: str, obs: str, actions: Sequence[str], pad_to: int = 0) -> np.ndarray:
    """Q_target(task, obs, a) - V(task, obs) per action; rows padded to `pad_to` (one compiled
    shape for any number of candidates)."""
    n = len(actions)
    m = max(n, pad_to)
    acts = list(actions) + [""] * (m - n)
    arrays = encode_fields(self.tokenizer, self.max_len, task=[task] * m, obs=[obs] * m, act=acts)
    return iql.advantages(self.nets, self.state, arrays)[:n]


class RetrospexAgent:
  def __init__(
    self,
    pool,
    tokenizer,
    materials: dict,
    prompt_set,
    critic: Critic,
    rescore: R.RescoreConfig = R.RescoreConfig(),
    settings: ActorSettings = ActorSettings(),
  ):
    self.pool, self.tok, self.materials, self.prompts = pool, tokenizer, materials, prompt_set
    self.critic, self.cfg, self.settings = critic, rescore, settings
    self.sampler_settings = SamplerSettings(cache_dtype=settings.cache_dtype)
    self.stop_ids = stop_ids(tokenizer)

  def run(
    self, params, model_config, specs: Sequence[tuple[str, int, int]], *, rng
  ) -> tuple[list, dict]:
    """specs: (task, variation, group) per episode -> (finished Episodes in spec order, counts:
    steps, choices made, and how often the critic changed the LLM's first choice)."""
    K = self.cfg.samples
    eps = [Episode(t, int(v), int(g), i, "eval", False) for i, (t, v, g) in enumerate(specs)]
    stats = {"steps": 0, "choices": 0, "critic_changed": 0}
    if not eps:
      return eps, stats
    session = Session(
      params,
      model_config,
      num_rows=len(eps) * K,
      max_tokens=self.settings.max_context,
      settings=self.sampler_settings,
    )
    chats = [ChatTokens(self.tok) for _ in eps]
    obs = reset_episodes(self.pool, eps)
    keep, t = {}, 0
    while True:
      live = [i for i, e in enumerate(eps) if not e.done]
      if not live:
        break
      requests = {}
      for i in live:
        e = eps[i]
        e.observations.append(obs[i])
        if not e.messages:
          msg = self.prompts.first_user_message(self.materials[(e.task, e.variation)], obs[i], ())
        else:
          msg = self.prompts.step_user_message(obs[i], ())
        e.messages.append({"role": "user", "content": msg})
        ids = chats[i].tokens(e.messages)
        for j in range(K):
          requests[i * K + j] = ids
          if len(e.messages) == 1:
            keep[i * K + j] = len(ids)
      out = session.step(
        requests,
        max_new_tokens=self.settings.max_new_tokens,
        temperature=self.cfg.temperature,
        top_p=self.settings.top_p,
        top_k=self.settings.top_k,
        stop_ids=self.stop_ids,
        rng=jax.random.fold_in(rng, t),
        keep_prefix=keep,
      )
      chosen = {}
      for i in live:
        texts, lps = [], []
        for j in range(K):
          toks, lp = out[i * K + j]
          texts.append(self.tok.decode(toks, skip_special_tokens=True).strip())
          lps.append(float(np.mean(lp)) if len(lp) else -np.inf)
        chosen[i] = self._choose(eps[i], obs[i], texts, lps, t, stats)
      results = self.pool.step([chosen.get(i) for i in range(len(eps))])
      for i in live:
        obs[i] = apply_step(eps[i], obs[i], chosen[i], results[i])
        stats["steps"] += 1
      t += 1
    return eps, stats

  def _choose(self, e, obs: str, texts, lps, t: int, stats: dict) -> str:
    cands = R.candidates(texts, lps, self.cfg.top_k)
    if not cands:  # every sample empty: send the first (the env corrects it)
      return texts[0]
    if len(cands) == 1:
      return cands[0][0]
    task = self.materials[(e.task, e.variation)].task_description.strip()
    q = self.critic.advantages(task, obs, [c for c, _ in cands], pad_to=self.cfg.top_k)
    p = np.exp([lp for _, lp in cands])
    i, _ = R.rescore(p, q, t + self.cfg.t0, self.cfg.discount, self.cfg.floor)
    stats["choices"] += 1
    stats["critic_changed"] += int(i != 0)  # candidates are sorted by log-prob: 0 = the LLM's
    return cands[i][0]


__all__ = ["Critic", "RetrospexAgent"]
