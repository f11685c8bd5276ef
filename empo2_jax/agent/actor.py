"""Host-side rollout loop: many ScienceWorld episodes in lock-step, one batched sampler call a step.

    actor = Actor(pool, tokenizer, materials, memory=..., settings=ActorSettings(...))
    episodes = actor.rollout(params, model_config, specs, use_memory=True, temperature=1.0,
                             rng=key, mode="off", reflect=True, iteration=it)

Per step, for every running episode: retrieve tips (memory rollouts: MiniLM key of the episode so
far -> cosine > threshold -> top-k by score), build the user message, tokenize the whole chat, and
make ONE `Session.step` call for all of them (prefix reuse: only new tokens are prefilled). The raw
model text goes into the chat; the pool corrects it to a valid action (word-level Jaccard) and
steps the simulators. After the last step, one more session call writes every episode's tip (the
tip chat extends the cached history), and the tips go into memory (SPEC §2-3).

Randomness: episode i (its index in `specs`) samples step t with fold_in(fold_in(k_steps, t), i)
and its tip with fold_in(k_reflect, i), (k_steps, k_reflect) = split(rng): what an episode draws
does not depend on the other episodes or on the host that runs it (multi-host: agent/hosts.py).

Memory keys (SPEC §3), two switches:
  memory_key_text "recent" (ours): the task line, then as many of the most recent observation/action
                  lines as fit MiniLM's 256 word pieces (dropped from the front). The full chat
                  would fill that window with the first prompt's boilerplate (few-shot examples,
                  templates) and make every key look alike.
                  "chat" (the release's): the chat so far, "user: ..." / "assistant: ..." lines
                  joined (no system message; earlier turns keep their tip blocks; the current user
                  message without tips), cut to the first 256 word pieces, i.e. what the encoder
                  sees of the whole chat. With the few-shot prompt this is the first user
                  message's head: every step of a variation gets (nearly) the same key.
  memory_key      "step" (paper-era): each step's memory is keyed by the key its step retrieved
                  with; "final" (release): all steps of an episode by the key of its end
                  ("recent": the lines up to the final observation; "chat": the whole chat).
The release's behaviour is memory_key="final" with memory_key_text="chat".

Retrieval for a variation that has no memory slot of its own (test variations in an evaluation
with memory) searches all of that task's slots and merges the hits by score.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Optional, Sequence

import numpy as np

import jax

from empo2_jax.agent import hosts, prompts
from empo2_jax.envs.fewshot import PromptMaterial
from empo2_jax.memory.reflect import MemoryWrite, clean_tip, format_score, memory_text, tip_chat
from empo2_jax.memory.rewards import intrinsic_reward
from empo2_jax.memory.sync import gather_and_commit
from empo2_jax.model.chat import ChatTokens
from empo2_jax.model.tokenizer import stop_ids
from empo2_jax.rl.batch import Turn
from empo2_jax.sampling.sampler import SamplerSettings, get_engine, row_keys
from empo2_jax.sampling.session import Session


MEMORY_KEYS = ("step", "final")
MEMORY_KEY_TEXTS = ("recent", "chat")


@dataclasses.dataclass(frozen=True)
class ActorSettings:
  max_new_tokens: int = 32
  max_context: int = 8192
  top_p: float = 1.0
  top_k: int = 0
  tip_max_new_tokens: int = 128
  tip_temperature: float = 1.0
  intrinsic_scale: float = 1.0
  intrinsic_reward: bool = True
  memory_key: str = "step"  # 'step' or 'final': which transcript keys a step's memory
  memory_key_text: str = "recent"  # 'recent' or 'chat': how a key's text is built (docstring)
  key_chars: int = 1200  # key length in characters when there is no encoder to count pieces
  cache_dtype: str = "bfloat16"

  def __post_init__(self):
    if self.memory_key not in MEMORY_KEYS:
      raise ValueError(f"memory_key={self.memory_key!r}; valid: {', '.join(MEMORY_KEYS)}")
    if self.memory_key_text not in MEMORY_KEY_TEXTS:
      raise ValueError(
        f"memory_key_text={self.memory_key_text!r}; valid: {', '.join(MEMORY_KEY_TEXTS)}"
      )


@dataclasses.dataclass
class Episode:
  task: str
  variation: int
  group_id: int
  rollout_id: int
  mode: str
  use_memory: bool
  messages: list = dataclasses.field(default_factory=list)
  key_lines: list = dataclasses.field(default_factory=list)  # compact transcript for keys
  step_keys: list = dataclasses.field(default_factory=list)  # key text used at each step
  turns: list = dataclasses.field(default_factory=list)  # rl.batch.Turn per step
  executed: list = dataclasses.field(default_factory=list)
  observations: list = dataclasses.field(default_factory=list)
  retrieved: list = dataclasses.field(default_factory=list)  # memories shown per step
  tips_shown: list = dataclasses.field(default_factory=list)  # their texts, per step
  score: float = 0.0
  done: bool = False
  success: bool = False
  env_failed: bool = False
  tip: str = ""
  final_observation: str = ""  # what the agent saw after its last action

  @property
  def episode_return(self) -> float:
    return float(self.score)


class Memory:
  """The encoder, store and index used together by the actor."""

  def __init__(self, encoder, store, index):
    self.encoder, self.store, self.index = encoder, store, index

  def retrieve(self, slots: Sequence, keys: Sequence[str]) -> list[list[str]]:
    if not keys:
      return []
    emb = self.encoder.encode(list(keys))
    own = [self.store.slot(s) is not None for s in slots]
    out = [[] for _ in keys]
    idx = [i for i, ok in enumerate(own) if ok]
    if idx:
      hits = self.index.search_batch([slots[i] for i in idx], emb[idx])
      for i, h in zip(idx, hits):
        out[i] = [x.text for x in h]
    for i, ok in enumerate(own):
      if not ok:  # unseen variation: every slot of the task, merged by stored score
        task_slots = [k for k in self.store.keys() if k[0] == slots[i][0]]
        merged = [
          x
          for k, h in zip(
            task_slots,
            self.index.search_batch(task_slots, np.repeat(emb[i : i + 1], len(task_slots), 0)),
          )
          for x in h
        ]
        merged.sort(key=lambda x: -x.score)
        out[i] = [x.text for x in merged[: self.index.cfg.top_k]]
    return out


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
  ):
    self.pool, self.tok, self.materials = pool, tokenizer, materials
    self.mesh = mesh
    self.memory, self.settings = memory, settings
    self.sampler_settings = dataclasses.replace(sampler_settings, cache_dtype=settings.cache_dtype)
    self.stop_ids = stop_ids(tokenizer)
    self.last_stats: dict = {}
    self._chats: dict = {}  # id(episode) -> ChatTokens, for the rollout in progress
    self._clock: collections.Counter = collections.Counter()  # phase -> seconds, this rollout

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
      return prompts.first_user_message(self.materials[(ep.task, ep.variation)], observation, tips)
    return prompts.step_user_message(observation, tips)

  def _key(self, ep: Episode, observation: Optional[str]) -> str:
    """The memory key of `ep` before its next user message (observation None: at its end)."""
    if self.settings.memory_key_text == "chat":
      messages = list(ep.messages)
      if observation is not None:
        messages.append({"role": "user", "content": self._user_message(ep, observation)})
      return self._chat_key(messages)
    return self._recent_key(ep, observation)

  def _chat_key(self, messages) -> str:
    """ "role: content" lines of the chat (system excluded), cut to the encoder's first window."""
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages if m["role"] != "system")
    enc = self.memory.encoder if self.memory is not None else None
    if enc is None:
      return text[: self.settings.key_chars]
    pieces = enc.tokenizer.encode(text)  # truncating tokenizer: the first window only
    if not pieces.overflowing:
      return text
    ends = [
      end for (_, end), special in zip(pieces.offsets, pieces.special_tokens_mask) if not special
    ]
    return text[: max(ends, default=0)]

  def _recent_key(self, ep: Episode, observation: Optional[str]) -> str:
    """Task line + the most recent observation/action lines that fit the encoder's window.

    Lines are dropped from the front, counted in the encoder's word pieces, so the current
    observation (the most step-specific part) is never what gets truncated.
    """
    head = f"task: {self.materials[(ep.task, ep.variation)].task_description.strip()}"
    lines = ep.key_lines + ([f"observation: {observation.strip()}"] if observation else [])
    enc = self.memory.encoder if self.memory is not None else None
    if enc is None:
      return "\n".join([head] + lines)[-self.settings.key_chars :]
    counts = [len(e.ids) - 2 for e in enc.tokenizer.encode_batch([head] + lines)]
    budget = enc.cfg.max_seq_length - 2 - counts[0]
    kept = []
    for line, n in zip(reversed(lines), reversed(counts[1:])):
      if n > budget and kept:
        break
      kept.append(line)
      budget -= n
    return "\n".join([head] + kept[::-1])

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
  ) -> list[Episode]:
    """specs: (task, variation, group_id) per episode. Returns finished episodes in spec order.

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
    episodes = [
      Episode(specs[i][0], int(specs[i][1]), int(specs[i][2]), i, mode, use_memory) for i in share
    ]
    stats = dict.fromkeys(
      ("retrieved", "memory_steps", "steps", "prefill_tokens", "reused_tokens", "truncations"), 0
    )
    session = None
    self._chats, self._clock = {}, collections.Counter()
    if episodes:  # a host may have none when there are fewer episodes than hosts
      engine = _EpisodeKeys(get_engine(model_config, self.sampler_settings, self.mesh), share)
      session = Session(
        params,
        model_config,
        num_rows=len(episodes),
        max_tokens=self.settings.max_context,
        settings=self.sampler_settings,
        mesh=self.mesh,
        engine=engine,
      )
      self._run_episodes(session, episodes, use_memory, temperature, k_steps, stats)
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
    keep = {}
    step_i = 0
    while True:
      live = [i for i, e in enumerate(episodes) if not e.done]
      if not live:
        break
      with self._timed("retrieval"):
        keys = [self._key(episodes[i], obs[i]) for i in live]
        tips = (
          self.memory.retrieve([(episodes[i].task, episodes[i].variation) for i in live], keys)
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
        out = self._sample(
          session,
          requests,
          jax.random.fold_in(rng, step_i),
          max_new_tokens=s.max_new_tokens,
          temperature=temperature,
          keep_prefix=keep,
        )
      texts = {i: self.tok.decode(out[i][0], skip_special_tokens=True).strip() for i in live}
      with self._timed("env"):
        results = self.pool.step([texts.get(i) for i in range(len(episodes))])
      for i in live:
        e, res = episodes[i], results[i]
        toks, lps = out[i]
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
        stats["retrieved"] += n_ret
        stats["memory_steps"] += int(use_memory)
        stats["steps"] += 1
      step_i += 1
    for e in episodes:
      for t in e.turns:
        t.episode_return = e.episode_return
    for k in ("prefill_tokens", "reused_tokens", "truncations"):
      stats[k] = int(session.stats[k])

  def _sample(
    self,
    session: Session,
    requests: dict,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float,
    keep_prefix=None,
  ) -> dict:
    """One session call; row r draws with fold_in(key, episode index of r) (see _EpisodeKeys)."""
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
    chat = tip_chat(e.messages)
    outcome = (
      f"Observation: {e.final_observation.strip()}\n\nThe episode is over; your final "
      f"score is {format_score(e.score)}/100.\n\n"
    )
    chat[-1] = {"role": "user", "content": outcome + chat[-1]["content"]}
    return chat

  def _reflect(
    self, session: Optional[Session], episodes: list[Episode], rng, iteration: int
  ) -> dict:
    """One session call writes this host's episodes' tips; all hosts' tips go into memory
    (memory/sync.gather_and_commit: a collective, called also by a host without episodes)."""
    s = self.settings
    todo = [i for i, e in enumerate(episodes) if e.turns and not e.env_failed]
    # The tip chat shows the outcome: the observation after the last action and the final score.
    requests = {i: self._ids(episodes[i], self._tip_messages(episodes[i])) for i in todo}
    out = (
      self._sample(
        session, requests, rng, max_new_tokens=s.tip_max_new_tokens, temperature=s.tip_temperature
      )
      if requests
      else {}
    )
    writes = []
    for i in todo:
      e = episodes[i]
      e.tip = clean_tip(self.tok.decode(out[i][0], skip_special_tokens=True))
      if not e.tip:
        continue
      final = e.final_observation if s.memory_key_text == "recent" else None
      keys = e.step_keys if s.memory_key == "step" else [self._key(e, final)] * len(e.executed)
      for action, key in zip(e.executed, keys):
        writes.append(
          MemoryWrite((e.task, e.variation), memory_text(e.tip, action, e.score), e.score, key)
        )
    _, uids = gather_and_commit(self.memory.store, self.memory.encoder, writes, iteration)
    return {
      "tips": sum(1 for i in todo if episodes[i].tip),
      "memory_writes": sum(u is not None for u in uids),
    }


class _EpisodeKeys:
  """A sampling Engine whose decode draws row r with fold_in(step_key, episode_ids[r]).

  Session.step draws row r with fold_in(rng, r), r being a slot of this host's session; on a pod
  the same episode would then sample differently depending on the host that runs it. The actor
  sets `step_key` before each call (`Actor._sample`) and rows draw with keys folded from their
  episode's index in the whole rollout instead. With one process the ids are 0..n-1 and the keys
  are exactly the ones Session draws itself. Everything else is the wrapped engine's.
  """

  def __init__(self, engine, episode_ids: Sequence[int]):
    self._engine, self._ids = engine, list(episode_ids)
    self.step_key = None

  def __getattr__(self, name):
    return getattr(self._engine, name)

  def decode(self, params, cache, hidden, length, active, keys, **kwargs):
    del keys  # fold_in(step_key, slot): replaced by per-episode keys
    if self.step_key is None:
      raise RuntimeError("_EpisodeKeys.decode before step_key was set (use Actor._sample)")
    keys = self._engine._rows(row_keys(self.step_key, self._ids))
    return self._engine.decode(params, cache, hidden, length, active, keys, **kwargs)


def material_for(env, task: str, variations: Sequence[int], n_few_shot: int = 2) -> dict:
  """{(task, variation): PromptMaterial} from a local SciWorldEnv (few-shot from train only)."""
  from empo2_jax.envs import fewshot

  shots = tuple(fewshot.gold_trajectories(env, task, n=n_few_shot))
  return {(task, int(v)): fewshot.prompt_material(env, task, int(v), shots) for v in variations}


__all__ = ["Actor", "ActorSettings", "Episode", "Memory", "material_for", "PromptMaterial"]
