"""The actor's records: its settings and one episode as it is rolled out (agent/actor.py), and
the two moves every rollout loop makes on an episode (the actor's and baselines/retrospex_agent's):
`reset_episodes` (the env's first observation) and `apply_step` (the env's answer to a response);
`record_turn`, the actor's step as a `rl/batch.Turn` and then `apply_step`.

    obs = reset_episodes(pool, episodes)
    ...                                                   # sample a response per live episode
    results = pool.step(actions)
    obs[i] = apply_step(episodes[i], obs[i], response_text, results[i])
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.memory.reflect import TIP_CHATS  # memory/reflect.reflection_chat
from empo2_jax.memory.rule_tip import check_reflector
from empo2_jax.rl.batch import Turn

MEMORY_KEYS = ("step", "final")
# What a method may ask the actor to record in Episode.extras (methods/base.Plugin.episode_records):
# "states", the env's bare state before each turn and after the last (ResetInfo/StepInfo.state,
# else the observation): SPA's world-model targets (methods/spa.py).
RECORDS = ("states",)
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
  memory_key_text: str = "chat"  # 'chat' or 'recent': how a key's text is built (docstring)
  tip_chat: str = "paper"  # 'paper', 'release' or 'outcome': the chat a tip is written from
  key_chars: int = 1200  # key length in characters when there is no encoder to count pieces
  cache_dtype: str = "bfloat16"
  reflector: str = "policy"  # or "rule": who writes the tip (memory/rule_tip.py)
  records: tuple = ()  # what the active methods ask to be recorded in Episode.extras (RECORDS)
  memory_frozen: bool = False  # memory.frozen: tips are written into episodes, never into memory

  def __post_init__(self):
    # The only check of the empo2 keys below (train/build.check_config builds this object).
    check_reflector(self.reflector)
    if set(self.records) - set(RECORDS):
      raise ValueError(f"records={self.records!r}; valid: {', '.join(RECORDS)}")
    if self.memory_key not in MEMORY_KEYS:
      raise ValueError(
        f"empo2.memory_key={self.memory_key!r}; valid: {', '.join(MEMORY_KEYS)} (the release "
        "keys by the final chat: memory_key=final with memory_key_text=chat)"
      )
    if self.memory_key_text not in MEMORY_KEY_TEXTS:
      raise ValueError(
        f"empo2.memory_key_text={self.memory_key_text!r}; valid: {', '.join(MEMORY_KEY_TEXTS)}"
      )
    if self.tip_chat not in TIP_CHATS:
      raise ValueError(f"empo2.tip_chat={self.tip_chat!r}; valid: {', '.join(TIP_CHATS)}")


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
  # tips retrieved but not shown, per step (Actor.rollout's shadow_memory; teacher views)
  shadow_tips: list = dataclasses.field(default_factory=list)
  shadow_memory: bool = False  # whether this episode keeps shadow_tips
  # tokens of the whole chat each step's prompt holds (before any sampler truncation)
  prompt_tokens: list = dataclasses.field(default_factory=list)
  score: float = 0.0
  done: bool = False
  success: bool = False
  env_failed: bool = False
  tip: str = ""
  final_observation: str = ""  # what the agent saw after its last action
  note: str = ""  # text opening the first user message (Actor.rollout's notes: Reflexion)
  # What the active methods asked to be recorded (ActorSettings.records; RECORDS), by name
  extras: dict = dataclasses.field(default_factory=dict)
  truncated: bool = False  # ended by the step limit (HeRL's hindsight says so)
  goals: str = ""  # the env's goal progress at the end (StepInfo.goals; HeRL's unmet goals)

  @property
  def episode_return(self) -> float:
    return float(self.score)


def reset_episodes(pool, episodes: list[Episode], records: Sequence[str] = ()) -> list[str]:
  """Resets every episode's env (envs/pool.EnvPool.reset); an env that failed to reset ends its
  episode at once; `records` (RECORDS) go into each episode's extras. The first observations, in
  order."""
  resets = pool.reset([(e.task, e.variation) for e in episodes])
  for e, r in zip(episodes, resets):
    e.env_failed = e.done = bool(r.info.env_failed)
    if "states" in records:
      e.extras.setdefault("states", []).append(r.info.state or r.observation)
  return [r.observation for r in resets]


def apply_step(e: Episode, obs: str, text: str, res, records: Sequence[str] = ()) -> str:
  """The env's result `res` (envs/base.StepResult) of the response `text` to observation `obs`,
  into `e`: the chat, the executed action, the key transcript, score and success, the end flags,
  the goal progress, and `records` (RECORDS) into its extras. The next observation."""
  e.messages.append({"role": "assistant", "content": text})
  e.executed.append(res.info.executed_action)
  e.key_lines += [f"observation: {obs.strip()}", f"action: {res.info.executed_action}"]
  e.score, e.success = float(res.info.score), bool(res.info.success)
  e.env_failed = e.env_failed or res.info.env_failed
  e.done = bool(res.done) or res.info.truncated or e.env_failed
  e.final_observation = res.observation
  if "states" in records:
    e.extras.setdefault("states", []).append(res.info.state or res.observation)
  e.truncated = bool(res.info.truncated)
  e.goals = getattr(res.info, "goals", "")
  return res.observation


def record_turn(
  e: Episode, obs: str, text: str, sampled, res, step: int, r_int: float, records=()
) -> str:
  """Step `step` of `e` (observation `obs`, response `text`, the sampler's (ids, log-probs[,
  per-token temperatures]), the env's result) as a Turn and in the episode; the next
  observation."""
  toks, lps = sampled[:2]
  token_temps = sampled[2] if len(sampled) > 2 else None
  e.turns.append(
    Turn(
      messages=list(e.messages),
      response=text,
      response_ids=[int(t) for t in toks],
      sampler_logprobs=[float(x) for x in lps],
      mode=e.mode,
      group_id=e.group_id,
      rollout_id=e.rollout_id,
      step=step,
      episode_return=0.0,
      reward=float(res.reward),
      intrinsic=r_int,
      obs_key=obs.strip(),
      valid=bool(res.info.valid),
      token_temps=None if token_temps is None else [float(x) for x in token_temps],
    )
  )
  return apply_step(e, obs, text, res, records)
