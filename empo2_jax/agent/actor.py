"""Host-side rollout loop: many ScienceWorld episodes in lock-step, one batched sampler call a step.

    actor = Actor(pool, tokenizer, materials, memory=..., settings=ActorSettings(...))
    episodes = actor.rollout(params, model_config, specs, use_memory=True, temperature=1.0,
                             rng=key, mode="off", reflect=True, iteration=it)

Per step, for every running episode: retrieve tips (memory rollouts: MiniLM key of the episode so
far -> cosine > threshold -> top-k by score), build the user message, tokenize the whole chat, and
make ONE `Session.step` call for all of them (prefix reuse: only new tokens are prefilled). The raw
model text goes into the chat; the pool corrects it to a valid action (word-level Jaccard) and
steps the simulators. After the last step, one more session call writes every episode's tip (from
the chat `settings.tip_chat` builds: memory/reflect.reflection_chat), and the tips go into memory
(docs/method.md §2-3).

Randomness: episode i (its index in `specs`) samples step t with fold_in(fold_in(k_steps, t), i)
and its tip with fold_in(k_reflect, i), (k_steps, k_reflect) = split(rng): what an episode draws
does not depend on the other episodes or on the host that runs it (multi-host: agent/hosts.py).

Memory keys (docs/fidelity.md), two switches:
  memory_key_text "chat" (default; the authors' code, both versions): the chat so far as
                  "user: ..." / "assistant: ..." lines (no system message, tip blocks removed,
                  the current user message included), cut to the first 256 word pieces, i.e.
                  what the encoder sees of the whole chat. With the few-shot prompt this is the
                  first user message's head: every step of a variation gets (nearly) the same key.
                  "recent" (ours): the task line, then as many of the most recent
                  observation/action lines as fit MiniLM's 256 word pieces (dropped from the
                  front), so that keys differ between steps.
  memory_key      "step" (paper-era): each step's memory is keyed by the key its step retrieved
                  with; "final" (release): all steps of an episode by the key of its end
                  ("recent": the lines up to the final observation; "chat": the whole chat).
The release's behaviour is memory_key="final" with memory_key_text="chat".

A variation that has no memory slot of its own retrieves nothing (n = 0, r_int = 1), as in the
authors' per-variation memory; only where the caller asks (`memory_fallback`: an evaluation with
memory on test variations, launch/adapt.py; config `memory.unseen_fallback`) does it search all of
that task's slots and merge the hits by score (docs/fidelity.md).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Optional, Sequence

import jax

from empo2_jax.agent import hosts, prompts
from empo2_jax.agent.episode import MEMORY_KEY_TEXTS, MEMORY_KEYS, ActorSettings, Episode
from empo2_jax.agent.episode_keys import EpisodeKeys
from empo2_jax.agent.materials import PromptMaterial, material_for
from empo2_jax.agent.memory import Memory, chat_key, recent_key
from empo2_jax.memory.reflect import MemoryWrite, clean_tip, memory_text, reflection_chat
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.memory.rule_tip import episode_rule_tip
from empo2_jax.memory.sync import gather_and_commit
from empo2_jax.model.chat import ChatTokens
from empo2_jax.model.tokenizer import stop_ids
from empo2_jax.rl.batch import Turn
from empo2_jax.sampling.sampler import SamplerSettings, get_engine
from empo2_jax.sampling.session import Session


class Actor:
  def __init__(
    self,
    pool,
    tokenizer,
    materials: dict,
    memory: Optional[Memory] = None,
    settings: ActorSettings = ActorSettings(),
    sampler_settings: SamplerSettings = SamplerSettings(),
    mesh=None,
    prompt_set: prompts.PromptSet = prompts.SCIENCEWORLD,
  ):
    self.pool, self.tok, self.materials = pool, tokenizer, materials
    self.prompts = prompt_set  # the env's messages (its registry entry's PromptSet)
    self.mesh = mesh
    self.memory, self.settings = memory, settings
    self.sampler_settings = dataclasses.replace(sampler_settings, cache_dtype=settings.cache_dtype)
    self.stop_ids = stop_ids(tokenizer)
    self.last_stats: dict = {}
    self._chats: dict = {}  # id(episode) -> ChatTokens, for the rollout in progress
    self._clock: collections.Counter = collections.Counter()  # phase -> seconds, this rollout
    # What the env reads of a response (explore/hooks.Explorer.env_text: SGE's text after the
    # strategy span, SPA's answer span); the chat keeps the whole response.
    self.env_text = lambda text: text

  # ------------------------------------------------------------------------------------------
  @contextlib.contextmanager
  def _timed(self, phase: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self._clock[phase] += time.perf_counter() - t0

  def _ids(self, e: Episode, messages) -> list[int]:
    """The chat's ids, tokenising only what is new since the episode's previous call."""
    chat = self._chats.get(id(e))
    if chat is None:
      chat = self._chats[id(e)] = ChatTokens(self.tok)
    with self._timed("tokenize"):
      return chat.tokens(messages)

  def _user_message(self, ep: Episode, observation: str, tips: Sequence[str] = ()) -> str:
    if not ep.messages:
      material = self.materials[(ep.task, ep.variation)]
      first = self.prompts.first_user_message(material, observation, tips)
      return f"{ep.note.strip()}\n\n{first}" if ep.note.strip() else first
    return self.prompts.step_user_message(observation, tips)

  def _key(self, ep: Episode, observation: Optional[str]) -> str:
    """The memory key of `ep` before its next user message (observation None: at its end)."""
    if self.settings.memory_key_text == "chat":
      messages = list(ep.messages)
      if observation is not None:
        messages.append({"role": "user", "content": self._user_message(ep, observation)})
      return self._chat_key(messages)
    return self._recent_key(ep, observation)

  def _chat_key(self, messages) -> str:
    enc = self.memory.encoder if self.memory is not None else None
    return chat_key(messages, enc, self.settings.key_chars)

  def _recent_key(self, ep: Episode, observation: Optional[str]) -> str:
    """Task line + the most recent observation/action lines that fit the encoder's window."""
    head = f"task: {self.materials[(ep.task, ep.variation)].task_description.strip()}"
    lines = ep.key_lines + ([f"observation: {observation.strip()}"] if observation else [])
    enc = self.memory.encoder if self.memory is not None else None
    return recent_key(head, lines, enc, self.settings.key_chars)

  def rollout(
    self,
    params,
    model_config,
    specs: Sequence[tuple[str, int, int]],
    *,
    use_memory: bool,
    temperature: float,
    rng: jax.Array,
    mode: str = "on",
    reflect: bool = False,
    iteration: int = 0,
    notes: Optional[Sequence[str]] = None,
    sampler=None,
    memory_fallback: bool = False,
  ) -> list[Episode]:
    """specs: (task, variation, group_id) per episode. Returns finished episodes in spec order.

    notes: optional text per spec that opens the episode's first user message (Reflexion's
    reflections, baselines/reflexion.py); "" for none.
    sampler: optional per-step sampler replacing the single session call (explore/hooks.py:
    SGE's two-phase sampling), sampler(actor, session, requests, key, episodes, temperature=,
    keep_prefix=) -> {i: (ids, logprobs, per-token temperatures)}.
    memory_fallback: a variation without a memory slot reads its task's other slots
    (agent/memory.Memory.retrieve); False (training, the authors' per-variation memory): nothing.

    Multi-host (agent/hosts.py): a collective; every process calls it with the same specs and
    steps only its share (`hosts.host_share`) in its own pool, with `params` on its own devices
    (`hosts.sampling_params`). Every process returns all episodes, and `last_stats` are summed
    over hosts. Episode i samples with keys folded from i, whichever host runs it.
    """
    if use_memory and self.memory is None:
      raise ValueError("use_memory=True needs an Actor built with a Memory")
    missing = sorted({(t, int(v)) for t, v, _ in specs} - set(self.materials))
    if missing:
      raise KeyError(f"no prompt material for {missing}; build the Actor with those variations")
    share = hosts.host_share(len(specs))
    k_steps, k_reflect = jax.random.split(rng)
    if notes is not None and len(notes) != len(specs):
      raise ValueError(f"{len(notes)} notes for {len(specs)} episodes")
    episodes = [
      Episode(specs[i][0], int(specs[i][1]), int(specs[i][2]), i, mode, use_memory) for i in share
    ]
    for e in episodes:
      e.note = str(notes[e.rollout_id]) if notes is not None else ""
    stats = dict.fromkeys(
      ("retrieved", "memory_steps", "steps", "prefill_tokens", "reused_tokens", "truncations"), 0
    )
    session = None
    self._chats, self._clock = {}, collections.Counter()
    if episodes:  # a host may have none when there are fewer episodes than hosts
      engine = EpisodeKeys(get_engine(model_config, self.sampler_settings, self.mesh), share)
      session = Session(
        params,
        model_config,
        num_rows=len(episodes),
        max_tokens=self.settings.max_context,
        settings=self.sampler_settings,
        mesh=self.mesh,
        engine=engine,
      )
      self._run_episodes(
        session, episodes, use_memory, temperature, k_steps, stats, sampler, memory_fallback
      )
    if reflect and self.memory is not None:
      with self._timed("reflect"):
        stats.update(self._reflect(session, episodes, k_reflect, iteration))
    # Wall-clock phases of this host's rollout (time/rollout_*): sampling (prefill + decode of
    # actions), env (resets and steps in the pool), tokenize (chat -> ids), retrieval (memory keys
    # and lookups), reflect (tip sampling, cleaning and the memory commit). Per host, not summed.
    stats.update({f"time/rollout_{k}": float(v) for k, v in self._clock.items()})
    self._chats = {}
    timings = tuple(k for k in stats if k.startswith("time/"))
    self.last_stats = hosts.sum_stats(stats, same_on_all_hosts=("memory_writes",) + timings)
    return hosts.gather_episodes(episodes)

  def _run_episodes(
    self,
    session: Session,
    episodes: list[Episode],
    use_memory: bool,
    temperature: float,
    rng: jax.Array,
    stats: dict,
    sampler=None,
    memory_fallback: bool = False,
  ) -> None:
    """Steps `episodes` (this host's) to their ends in lock-step; step t samples with
    fold_in(fold_in(rng, t), episode index)."""
    s = self.settings
    with self._timed("env"):
      resets = self.pool.reset([(e.task, e.variation) for e in episodes])
    obs = [r.observation for r in resets]
    for e, r in zip(episodes, resets):
      e.env_failed = r.info.env_failed
      e.done = e.env_failed
      e.states.append(r.info.state or r.observation)
    keep = {}
    step_i = 0
    while True:
      live = [i for i, e in enumerate(episodes) if not e.done]
      if not live:
        break
      with self._timed("retrieval"):
        keys = [self._key(episodes[i], obs[i]) for i in live]
        tips = (
          self.memory.retrieve(
            [(episodes[i].task, episodes[i].variation) for i in live], keys, memory_fallback
          )
          if use_memory
          else [[] for _ in live]
        )
      requests = {}
      for i, key, tip in zip(live, keys, tips):
        e = episodes[i]
        e.step_keys.append(key)
        e.retrieved.append(len(tip))
        e.tips_shown.append(list(tip))
        e.observations.append(obs[i])
        e.messages.append({"role": "user", "content": self._user_message(e, obs[i], tip)})
        ids = self._ids(e, e.messages)
        if len(e.messages) == 1:
          keep[i] = len(ids)  # on overflow, keep the first prompt and the recent turns
        requests[i] = ids
      with self._timed("sampling"):
        step_key = jax.random.fold_in(rng, step_i)
        if sampler is None:
          out = self.sample(
            session,
            requests,
            step_key,
            max_new_tokens=s.max_new_tokens,
            temperature=temperature,
            keep_prefix=keep,
          )
        else:  # a method's sampler (explore/hooks.py), also returning per-token temperatures
          out = sampler(
            self, session, requests, step_key, episodes, temperature=temperature, keep_prefix=keep
          )
      texts = {i: self.tok.decode(out[i][0], skip_special_tokens=True).strip() for i in live}
      with self._timed("env"):
        env_texts = {i: self.env_text(t) for i, t in texts.items()}
        results = self.pool.step([env_texts.get(i) for i in range(len(episodes))])
      for i in live:
        e, res = episodes[i], results[i]
        toks, lps = out[i][:2]
        token_temps = out[i][2] if len(out[i]) > 2 else None
        n_ret = e.retrieved[-1]
        r_int = (
          float(intrinsic_reward(n_ret, s.intrinsic_scale))
          if use_memory and s.intrinsic_reward
          else 0.0
        )
        e.turns.append(
          Turn(
            messages=list(e.messages),
            response=texts[i],
            response_ids=[int(t) for t in toks],
            sampler_logprobs=[float(x) for x in lps],
            mode=e.mode,
            group_id=e.group_id,
            rollout_id=e.rollout_id,
            step=step_i,
            episode_return=0.0,
            reward=float(res.reward),
            intrinsic=r_int,
            obs_key=obs[i].strip(),
            valid=bool(res.info.valid),
            token_temps=None if token_temps is None else [float(x) for x in token_temps],
          )
        )
        e.messages.append({"role": "assistant", "content": texts[i]})
        e.executed.append(res.info.executed_action)
        e.key_lines += [f"observation: {obs[i].strip()}", f"action: {res.info.executed_action}"]
        e.score, e.success = float(res.info.score), bool(res.info.success)
        e.env_failed = e.env_failed or res.info.env_failed
        e.done = bool(res.done) or res.info.truncated or e.env_failed
        obs[i] = res.observation
        e.final_observation = res.observation
        e.states.append(res.info.state or res.observation)
        e.truncated = bool(res.info.truncated)
        e.goals = getattr(res.info, "goals", "")
        stats["retrieved"] += n_ret
        stats["memory_steps"] += int(use_memory)
        stats["steps"] += 1
      step_i += 1
    for e in episodes:
      for t in e.turns:
        t.episode_return = e.episode_return
    for k in ("prefill_tokens", "reused_tokens", "truncations"):
      stats[k] = int(session.stats[k])

  def sample(
    self,
    session: Session,
    requests: dict,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float,
    keep_prefix=None,
  ) -> dict:
    """One session call; row r draws with fold_in(key, episode index of r) (see EpisodeKeys)."""
    session.engine.step_key = key
    s = self.settings
    return session.step(
      requests,
      max_new_tokens=max_new_tokens,
      temperature=temperature,
      top_p=s.top_p,
      top_k=s.top_k,
      stop_ids=self.stop_ids,
      rng=key,
      keep_prefix=keep_prefix,
    )

  # ------------------------------------------------------------------------------------------
  def _tip_messages(self, e: Episode) -> list:
    """The tip chat of `e` (settings.tip_chat: memory/reflect.reflection_chat)."""
    outcome = prompts.outcome_message(e.final_observation, e.score, self.prompts.score_out_of)
    return reflection_chat(e.messages, self.settings.tip_chat, e.final_observation, outcome)

  def _reflect(
    self, session: Optional[Session], episodes: list[Episode], rng, iteration: int
  ) -> dict:
    """One session call writes this host's episodes' tips; all hosts' tips go into memory
    (memory/sync.gather_and_commit: a collective, called also by a host without episodes)."""
    s = self.settings
    todo = [i for i, e in enumerate(episodes) if e.turns and not e.env_failed]
    # empo2.reflector="rule" (memory/rule_tip.py, a mechanism check): no tip is sampled.
    sampled = todo if s.reflector == "policy" else []
    requests = {i: self._ids(episodes[i], self._tip_messages(episodes[i])) for i in sampled}
    out = (
      self.sample(
        session, requests, rng, max_new_tokens=s.tip_max_new_tokens, temperature=s.tip_temperature
      )
      if requests
      else {}
    )
    writes = []
    for i in todo:
      e = episodes[i]
      raw = self.tok.decode(out[i][0], skip_special_tokens=True) if i in out else None
      e.tip = clean_tip(episode_rule_tip(e) if raw is None else raw)
      if not e.tip:
        continue
      final = e.final_observation if s.memory_key_text == "recent" else None
      keys = e.step_keys if s.memory_key == "step" else [self._key(e, final)] * len(e.executed)
      for action, key in zip(e.executed, keys):
        writes.append(
          MemoryWrite(
            (e.task, e.variation),
            memory_text(e.tip, action, e.score, self.prompts.score_out_of),
            e.score,
            key,
          )
        )
    _, uids = gather_and_commit(self.memory.store, self.memory.encoder, writes, iteration)
    return {
      "tips": sum(1 for i in todo if episodes[i].tip),
      "memory_writes": sum(u is not None for u in uids),
    }


__all__ = [
  "Actor",
  "ActorSettings",
  "Episode",
  "EpisodeKeys",
  "MEMORY_KEYS",
  "MEMORY_KEY_TEXTS",
  "Memory",
  "material_for",
  "PromptMaterial",
]
