"""Host-side rollout loop: many episodes in lock-step, one batched sampler call a step; then the
episodes' tips.

    actor = Actor(pool, tokenizer, materials, memory=..., settings=ActorSettings(...),
                  prompt_set=suite.prompts, env_text=hooks.env_text)
    rollout = actor.rollout(params, model_config, specs, use_memory=True, temperature=1.0,
                            rng=key, mode="off")
    rollout.episodes, rollout.stats          # every host's episodes, the rollout's counters
    tip_stats = actor.reflect(rollout, iteration=it)   # tips -> memory (docs/method.md §2-3)
    rollout.close()                          # frees the sampler session

Per step, for every running episode: retrieve tips (memory rollouts: MiniLM key of the episode so
far -> cosine > threshold -> top-k by score), build the user message, tokenize the whole chat, and
make ONE `Session.step` call for all of them (prefix reuse: only new tokens are prefilled). The raw
model text goes into the chat; the pool corrects it to a valid action (word-level Jaccard) and
steps the simulators. The rollout keeps its session open: `reflect` writes every finished
episode's tip with one more call on it (from the chat `settings.tip_chat` builds:
memory/reflect.reflection_chat, so only the tip prompt is prefilled), and the tips go into memory
(memory/reflect.memory_writes, memory/sync.gather_and_commit).

Randomness: with (k_steps, k_tips) = split(rng), episode i (its index in `specs`) samples step t
with fold_in(fold_in(k_steps, t), i) and its tip with fold_in(k_tips, i): what an episode draws
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
import itertools
import time
from typing import Callable, Optional, Sequence, Union

import jax

from empo2_jax.agent import hosts, prompts, tip_writer
from empo2_jax.agent.episode import ActorSettings, Episode, record_turn, reset_episodes
from empo2_jax.agent.episode_keys import EpisodeKeys
from empo2_jax.agent.memory import Memory, chat_key, recent_key
from empo2_jax.agent.rollout import SESSION_COUNTERS, Rollout, per_spec, step_counts
from empo2_jax.envs.base import PromptSet
from empo2_jax.memory.reflect import reflection_chat
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.model.chat import ChatTokens
from empo2_jax.model.tokenizer import stop_ids
from empo2_jax.sampling.sampler import SamplerSettings, get_engine
from empo2_jax.sampling.session import Session


def whole_response(text: str) -> str:
  """The default `env_text`: the env reads the whole response."""
  return text


class Actor:
  def __init__(
    self,
    pool,
    tokenizer,
    materials: dict,
    memory: Optional[Memory] = None,
    settings: ActorSettings = ActorSettings(),
    sampler_settings: SamplerSettings = SamplerSettings(),
    *,
    prompt_set: PromptSet,
    mesh=None,
    env_text: Callable[[str], str] = whole_response,
  ):
    """prompt_set: the env suite's messages (envs/registry.py: build.suite(config).prompts), the
    system prompt, the tip and reflection texts the actor writes with. env_text: what the env
    reads of a response (methods/base.Hooks.env_text: SGE's text after the strategy span, SPA's
    answer span); the chat keeps the whole response."""
    self.pool, self.tok, self.materials = pool, tokenizer, materials
    self.prompts = prompt_set  # the env's messages (its registry entry's PromptSet)
    self.mesh = mesh
    self.memory, self.settings = memory, settings
    self.sampler_settings = dataclasses.replace(sampler_settings, cache_dtype=settings.cache_dtype)
    self.stop_ids = stop_ids(tokenizer)
    self.env_text = env_text
    self._clock: collections.Counter = collections.Counter()  # phase -> seconds, this rollout

  # ------------------------------------------------------------------------------------------
  @contextlib.contextmanager
  def _timed(self, phase: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self._clock[phase] += time.perf_counter() - t0

  def user_message(self, ep: Episode, observation: str, tips: Sequence[str] = ()) -> str:
    """The next user message of `ep`: the first one (the task's material, opened by the
    episode's note) or a step's."""
    return self._user_text(ep, not ep.messages, observation, tips)

  def _user_text(self, ep: Episode, first: bool, observation: str, tips: Sequence[str]) -> str:
    if first:
      material = self.materials[(ep.task, ep.variation)]
      text = self.prompts.first_user_message(material, observation, tips)
      return f"{ep.note.strip()}\n\n{text}" if ep.note.strip() else text
    return self.prompts.step_user_message(observation, tips)

  def chats_with_tips(
    self,
    ep: Episode,
    tips_per_step: Sequence[Sequence[str]],
    turns: Optional[Sequence[int]] = None,
  ) -> list:
    """Turn chats as they would read with tips_per_step[j] shown in the j-th user message (the
    teacher views of methods/ctx_distill.py and methods/opid.py).

    Args:
      ep: a finished episode.
      tips_per_step: the tips of each step's user message (missing steps: none).
      turns: the turn indices to return (None: every turn).
    Returns:
      [chat of turn k for k in turns]: the turn's messages with every user message rebuilt from
      its observation. A user message is built once and shared by the chats that hold it."""
    users: list[dict] = []  # the j-th rebuilt user message

    def user(j: int) -> dict:
      while len(users) <= j:
        k = len(users)
        tips = tips_per_step[k] if k < len(tips_per_step) else ()
        text = self._user_text(ep, k == 0, ep.observations[k], tips)
        users.append({"role": "user", "content": text})
      return users[j]

    out = []
    for k in range(len(ep.turns)) if turns is None else turns:
      chat, j = [], 0
      for m in ep.turns[k].messages:
        if m["role"] == "user":
          m, j = user(j), j + 1
        chat.append(m)
      out.append(chat)
    return out

  def key_text(self, ep: Episode, observation: Optional[str]) -> str:
    """The memory key of `ep` before its next user message (observation None: at its end)."""
    enc = self.memory.encoder if self.memory is not None else None
    if self.settings.memory_key_text == "chat":
      messages = list(ep.messages)
      if observation is not None:
        messages.append({"role": "user", "content": self.user_message(ep, observation)})
      return chat_key(messages, enc, self.settings.key_chars)
    # "recent": the task line + the most recent observation/action lines that fit the window
    head = f"task: {self.materials[(ep.task, ep.variation)].task_description.strip()}"
    lines = ep.key_lines + ([f"observation: {observation.strip()}"] if observation else [])
    return recent_key(head, lines, enc, self.settings.key_chars)

  def tip_writing_chat(self, e: Episode) -> list:
    """The chat `e`'s tip is written from (settings.tip_chat: memory/reflect.reflection_chat)."""
    outcome = prompts.outcome_message(e.final_observation, e.score, self.prompts.score_out_of)
    return reflection_chat(e.messages, self.settings.tip_chat, e.final_observation, outcome)

  # -- the rollout ------------------------------------------------------------------------------
  def rollout(
    self,
    params,
    model_config,
    specs: Sequence[tuple[str, int, int]],
    *,
    use_memory: Union[bool, Sequence[bool]],
    temperature: float,
    rng: jax.Array,
    mode: str = "on",
    notes: Optional[Sequence[str]] = None,
    sampler=None,
    memory_fallback: bool = False,
    shadow_memory: Union[bool, Sequence[bool]] = False,
    stop_check: Optional[Callable[[], None]] = None,
  ) -> Rollout:
    """specs: (task, variation, group_id) per episode. The finished episodes are in spec order.

    notes: optional text per spec that opens the episode's first user message (Reflexion's
    reflections, baselines/reflexion.py); "" for none.
    sampler: optional per-step sampler replacing the single session call (a method plugin's
    train_sampler, e.g. SGE's two-phase sampling), sampler(actor, session, requests, key,
    episodes, temperature=, keep_prefix=) -> {i: (ids, logprobs, per-token temperatures)}.
    memory_fallback: a variation without a memory slot reads its task's other slots
    (agent/memory.Memory.retrieve); False (training, the authors' per-variation memory): nothing.
    shadow_memory (with use_memory False): "shadow retrieval", the tips a memory step would show
    are retrieved at every step and kept in Episode.shadow_tips, but not shown to the sampler
    (no intrinsic reward either: nothing was shown).
    use_memory and shadow_memory are one flag for every episode or one per spec (a group that
    mixes both kinds of rollout: ctx_distill's EDGE gate); an episode has at most one of them.
    stop_check: called at every turn boundary; it may raise to abandon the rollout (the trainer's
    preemption stop, train/run_control.StopSignal.check_turn).

    Multi-host (agent/hosts.py): a collective; every process calls it with the same specs and
    steps only its share (`hosts.host_share`) in its own pool, with `params` on its own devices
    (`hosts.sampling_params`). Every process gets all episodes, and the stats' counters summed
    over hosts. Episode i samples with keys folded from i, whichever host runs it.
    """
    shown = per_spec(use_memory, len(specs), "use_memory")
    shadow = per_spec(shadow_memory, len(specs), "shadow_memory")
    if (any(shown) or any(shadow)) and self.memory is None:
      raise ValueError("use_memory=True or shadow_memory=True needs an Actor built with a Memory")
    if any(a and b for a, b in zip(shown, shadow)):
      raise ValueError(
        "shadow_memory retrieves tips without showing them: an episode with it needs "
        "use_memory False"
      )
    missing = sorted({(t, int(v)) for t, v, _ in specs} - set(self.materials))
    if missing:
      raise KeyError(f"no prompt material for {missing}; build the Actor with those variations")
    if notes is not None and len(notes) != len(specs):
      raise ValueError(f"{len(notes)} notes for {len(specs)} episodes")
    share = hosts.host_share(len(specs))
    k_steps, k_tips = jax.random.split(rng)
    own = [
      Episode(specs[i][0], int(specs[i][1]), int(specs[i][2]), i, mode, shown[i]) for i in share
    ]
    for e in own:
      e.shadow_memory = shadow[e.rollout_id]
      e.note = str(notes[e.rollout_id]) if notes is not None else ""
    out = Rollout([], {}, own, [ChatTokens(self.tok) for _ in own], tip_key=k_tips)
    self._clock = collections.Counter()
    if own:  # a host may have none when there are fewer episodes than hosts
      engine = EpisodeKeys(get_engine(model_config, self.sampler_settings, self.mesh), share)
      out.session = Session(
        params,
        model_config,
        num_rows=len(own),
        max_tokens=self.settings.max_context,
        settings=self.sampler_settings,
        mesh=self.mesh,
        engine=engine,
      )
      self._run_episodes(out, temperature, k_steps, sampler, memory_fallback, stop_check)
    stats = step_counts(own)
    stats.update({k: int(out.session.stats[k]) if own else 0 for k in SESSION_COUNTERS})
    # Wall-clock phases of this host's rollout (time/rollout_*): sampling (prefill + decode of
    # actions), env (resets and steps in the pool), tokenize (chat -> ids), retrieval (memory keys
    # and lookups). Per host, not summed.
    timings = {f"time/rollout_{k}": float(v) for k, v in self._clock.items()}
    out.stats = hosts.sum_stats({**stats, **timings}, same_on_all_hosts=tuple(timings))
    out.episodes = hosts.gather_episodes(own)
    return out

  def _run_episodes(
    self, run: Rollout, temperature: float, rng, sampler, memory_fallback: bool, stop_check=None
  ) -> None:
    """Steps this host's episodes to their ends in lock-step; step t samples with
    fold_in(fold_in(rng, t), episode index). Each episode's use_memory / shadow_memory says
    whether its tips are shown or only kept."""
    episodes = run.own
    obs = self._reset(episodes)
    keep = {}  # row -> its first prompt's length: kept on overflow, with the recent turns
    for step in itertools.count():
      if stop_check is not None:
        stop_check()
      live = [i for i, e in enumerate(episodes) if not e.done]
      if not live:
        break
      with self._timed("retrieval"):
        keys = [self.key_text(episodes[i], obs[i]) for i in live]
        found = self._retrieve([episodes[i] for i in live], keys, memory_fallback)
        tips = [t if episodes[i].use_memory else [] for i, t in zip(live, found)]
        for i, tip in zip(live, found):
          if episodes[i].shadow_memory:  # retrieved and kept, not shown
            episodes[i].shadow_tips.append(list(tip))
      requests = self._prompts(run, live, obs, keys, tips, keep)
      with self._timed("sampling"):
        step_key = jax.random.fold_in(rng, step)
        if sampler is None:
          out = self.sample(
            run.session,
            requests,
            step_key,
            max_new_tokens=self.settings.max_new_tokens,
            temperature=temperature,
            keep_prefix=keep,
          )
        else:  # a method's sampler (Plugin.train_sampler), also returning per-token temperatures
          out = sampler(
            self,
            run.session,
            requests,
            step_key,
            episodes,
            temperature=temperature,
            keep_prefix=keep,
          )
      texts = {i: self.tok.decode(out[i][0], skip_special_tokens=True).strip() for i in live}
      with self._timed("env"):
        env_texts = {i: self.env_text(t) for i, t in texts.items()}
        results = self.pool.step([env_texts.get(i) for i in range(len(episodes))])
      for i in live:
        r_int = self._intrinsic(episodes[i].retrieved[-1], episodes[i].use_memory)
        obs[i] = record_turn(
          episodes[i], obs[i], texts[i], out[i], results[i], step, r_int, self.settings.records
        )
    for e in episodes:
      for t in e.turns:
        t.episode_return = e.episode_return

  def _reset(self, episodes: list[Episode]) -> list[str]:
    """Every episode's first observation (its env reset)."""
    with self._timed("env"):
      return reset_episodes(self.pool, episodes, self.settings.records)

  def _retrieve(self, episodes, keys, fallback: bool) -> list[list[str]]:
    """The tips this step retrieves for each episode with memory (shown or shadow), in one
    lookup; none for the others."""
    want = [i for i, e in enumerate(episodes) if e.use_memory or e.shadow_memory]
    out = [[] for _ in episodes]
    if want:
      slots = [(episodes[i].task, episodes[i].variation) for i in want]
      for i, tip in zip(want, self.memory.retrieve(slots, [keys[i] for i in want], fallback)):
        out[i] = tip
    return out

  def _prompts(self, run: Rollout, live, obs, keys, tips, keep: dict) -> dict:
    """Each live row's next user message into its chat; {row: the chat's token ids}."""
    requests = {}
    for i, key, tip in zip(live, keys, tips):
      e = run.own[i]
      e.step_keys.append(key)
      e.retrieved.append(len(tip))
      e.tips_shown.append(list(tip))
      e.observations.append(obs[i])
      e.messages.append({"role": "user", "content": self.user_message(e, obs[i], tip)})
      with self._timed("tokenize"):  # only what is new since the row's previous call
        ids = run.chats[i].tokens(e.messages)
      e.prompt_tokens.append(len(ids))
      if len(e.messages) == 1:
        keep[i] = len(ids)
      requests[i] = ids
    return requests

  def _intrinsic(self, n_retrieved: int, use_memory: bool) -> float:
    """r_int = scale / (n + 1) on a memory step (docs/method.md §3), else 0."""
    s = self.settings
    if not (use_memory and s.intrinsic_reward):
      return 0.0
    return float(intrinsic_reward(n_retrieved, s.intrinsic_scale))

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

  # -- the tips ---------------------------------------------------------------------------------
  def reflect(self, rollout: Rollout, iteration: int) -> dict:
    """The tips of the rollout's finished episodes, into memory on every host (docs/method.md
    §2-3; agent/tip_writer.py): the policy writes this host's tips in one call on the rollout's
    open session (empo2.reflector="rule": memory/rule_tip.py writes them, nothing is sampled).
    Sets every episode's `tip`. A collective: every process calls it, also one without episodes.
    Returns {"tips", "memory_writes", "time/rollout_reflect"} (tips summed over hosts)."""
    return tip_writer.reflect(self, rollout, iteration)


__all__ = ["Actor", "ActorSettings", "Episode", "Memory", "Rollout"]
