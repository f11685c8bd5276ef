"""Reflexion (Shinn et al. 2023; docs/methods.md §2) as a baseline: no weight updates; on each test
variation, K trials in sequence; after a failed trial the policy writes a short plan (a
"reflection"); the last N reflections open the next trial's first prompt.

    result = run(actor, params, model_config, tokenizer, task, variations, ReflexionConfig(),
                 temperature=0.4, rng=key)
    result.final_returns, result.curve()      # the last trial's returns; per-trial means

Per trial, the variations not solved yet run once each (Actor.rollout with `notes`, the memory
block below); a solved variation is not run again and keeps the return and success of the trial
that solved it (Reflexion's protocol). Then every failed episode gets a reflection, all in one
batched sampler call: the policy reads the reflection prompt (the task, the failed trajectory as
text, the plans of earlier trials) and answers with its new plan. Defaults follow the original:
10 trials, the last 3 reflections in context, reflections greedy (temperature 0).

The memory block, prepended to the first user message of trial k:
    Your memory for the task below (plans you wrote after earlier failed attempts):
    Trial 1:
    <plan>
    ...
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

import jax

from empo2_jax.train.metrics import return_summary

MEMORY_HEADER = "Your memory for the task below (plans you wrote after earlier failed attempts):"
REFLECTION_PROMPT = (
  "Below is the record of an attempt of yours at a task in a text environment. The attempt did "
  "not succeed. Do not describe the environment. Think about the strategy you followed and where "
  "it went wrong, then write a short new plan for your next attempt at the same task: name the "
  "specific actions you should have taken (for example, if you did A and B but never C, plan to "
  "do C, with the environment's own actions)."
)


@dataclasses.dataclass(frozen=True)
class ReflexionConfig:
  trials: int = 10
  memory_size: int = 3  # reflections in context
  max_new_tokens: int = 128  # of a reflection (the original allowed 256)
  temperature: float = 0.0  # of the reflections (greedy, as the original)
  max_trajectory_chars: int = 6400  # the trajectory text is cut from the front beyond this

  def __post_init__(self):
    if self.trials < 1 or self.memory_size < 0:
      raise ValueError(f"trials={self.trials} must be >= 1, memory_size={self.memory_size} >= 0")


def memory_block(reflections: Sequence[tuple[int, str]], memory_size: int) -> str:
  """The note opening the next trial's prompt: the last `memory_size` (trial, reflection) pairs;
  "" when there are none."""
  shown = list(reflections)[-memory_size:] if memory_size else []
  if not shown:
    return ""
  return "\n".join([MEMORY_HEADER] + [f"Trial {k + 1}:\n{text.strip()}" for k, text in shown])


def trajectory_text(task_description: str, episode, out_of: Optional[float] = 100) -> str:
  """The failed attempt as text: the task, then observation / action lines, the last observation
  and the final score."""
  from empo2_jax.memory.reflect import format_score

  lines = [f"Task: {task_description.strip()}"]
  for obs, turn in zip(episode.observations, episode.turns):
    lines += [f"Observation: {obs.strip()}", f"> {turn.response.strip()}"]
  lines.append(f"Observation: {episode.final_observation.strip()}")
  of = f"/{format_score(out_of)}" if out_of else ""
  lines.append(f"Final score: {format_score(episode.score)}{of} (the task was not completed)")
  return "\n".join(lines)


def reflection_messages(
  trajectory: str, past: Sequence[tuple[int, str]], memory_size: int, max_chars: int
) -> list[dict]:
  """The chat the policy answers with its reflection: prompt, trajectory (its last max_chars
  characters), the last memory_size plans, "New plan:"."""
  if len(trajectory) > max_chars:
    trajectory = "..." + trajectory[-max_chars:]
  parts = [REFLECTION_PROMPT, trajectory]
  shown = list(past)[-memory_size:] if memory_size else []
  if shown:
    parts.append(
      "Plans from past attempts:\n" + "\n".join(f"Trial #{k + 1}: {t.strip()}" for k, t in shown)
    )
  parts.append("New plan:")
  return [{"role": "user", "content": "\n\n".join(parts)}]


def clean_reflection(raw: str, max_words: int = 120) -> str:
  """Printable text, chat markup removed, whitespace collapsed, at most max_words words."""
  from empo2_jax.text import printable_text

  text = " ".join(printable_text(line) for line in str(raw).splitlines())
  for tag in ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<tip>", "</tip>"):
    text = text.replace(tag, " ")
  return " ".join(text.split()[:max_words])


def policy_writer(
  params, model_config, tokenizer, cfg: ReflexionConfig, max_context: int, sampler_settings=None
):
  """A reflection writer (chats, rng) -> texts that samples the policy in one batched call; chats
  longer than max_context - max_new_tokens tokens lose the front of their trajectory.
  sampler_settings: the actor's (cache dtype), e.g. `actor.sampler_settings`."""
  from empo2_jax.sampling.sampler import SamplerSettings

  from empo2_jax.model.chat import chat_ids
  from empo2_jax.model.tokenizer import stop_ids
  from empo2_jax.sampling.sampler import generate

  budget = max_context - cfg.max_new_tokens - 8

  def write(chats: list[list[dict]], rng) -> list[str]:
    if not chats:
      return []
    ids = []
    for chat in chats:
      msg = chat[-1]["content"]
      p = chat_ids(tokenizer, chat)
      while len(p) > budget and len(msg) > 200:  # drop the oldest part of the trajectory text
        cut = len(REFLECTION_PROMPT) + 2
        msg = msg[:cut] + "..." + msg[cut + max(100, (len(p) - budget) * 3) :]
        p = chat_ids(tokenizer, chat[:-1] + [{"role": "user", "content": msg}])
      ids.append(p)
    out = generate(
      params,
      model_config,
      ids,
      max_new_tokens=cfg.max_new_tokens,
      temperature=cfg.temperature,
      stop_ids=stop_ids(tokenizer),
      rng=rng,
      settings=sampler_settings or SamplerSettings(),
    )
    return [tokenizer.decode(t, skip_special_tokens=True) for t, _ in out]

  return write


@dataclasses.dataclass
class ReflexionResult:
  variations: list[int]
  returns: np.ndarray  # [trials, variations]: each variation's return after each trial
  successes: np.ndarray  # [trials, variations] bool (a solved variation stays solved)
  reflections: dict  # variation -> [(trial, text)]
  prompts: dict  # (trial, variation) -> the first user message that trial saw (run variations)
  ran: np.ndarray  # [trials, variations] bool: the variation was run in that trial

  @property
  def final_returns(self) -> np.ndarray:
    return self.returns[-1]

  @property
  def final_successes(self) -> np.ndarray:
    return self.successes[-1]

  def curve(self) -> list[dict]:
    """Per trial: mean and std of the returns, success rate (cumulative), variations run."""
    return [
      {
        "trial": k + 1,
        **return_summary(self.returns[k], self.successes[k]),
        "ran": int(self.ran[k].sum()),
      }
      for k in range(len(self.returns))
    ]


def run(
  actor,
  params,
  model_config,
  task: str,
  variations: Sequence[int],
  cfg: ReflexionConfig,
  *,
  temperature: float,
  rng: jax.Array,
  writer: Callable[[list[list[dict]], jax.Array], list[str]],
  out_of: Optional[float] = 100,
) -> ReflexionResult:
  """Reflexion over `variations` of `task` (module docstring). `writer` writes reflections
  (policy_writer, or a stand-in in tests); the actor never writes tips into its memory
  (Actor.reflect) and nothing updates `params`."""
  variations = [int(v) for v in variations]
  n = len(variations)
  returns = np.zeros((cfg.trials, n))
  successes = np.zeros((cfg.trials, n), bool)
  ran = np.zeros((cfg.trials, n), bool)
  reflections: dict[int, list[tuple[int, str]]] = {v: [] for v in variations}
  prompts: dict = {}
  last_return, solved = np.zeros(n), np.zeros(n, bool)
  for k in range(cfg.trials):
    k_roll, k_refl = jax.random.split(jax.random.fold_in(rng, k))
    todo = [j for j in range(n) if not solved[j]]
    if todo:
      specs = [(task, variations[j], j) for j in todo]
      notes = [memory_block(reflections[variations[j]], cfg.memory_size) for j in todo]
      episodes = actor.rollout(
        params,
        model_config,
        specs,
        use_memory=False,
        temperature=temperature,
        rng=k_roll,
        mode="eval",
        notes=notes,
      ).episodes
      failed = []
      for j, e in zip(todo, episodes):
        ran[k, j] = True
        prompts[(k, variations[j])] = e.messages[0]["content"] if e.messages else ""
        last_return[j] = e.episode_return
        solved[j] = bool(e.success)
        if not e.success and not e.env_failed and e.turns:
          failed.append((j, e))
      chats = []
      for j, e in failed:
        desc = actor.materials[(task, variations[j])].task_description
        chats.append(
          reflection_messages(
            trajectory_text(desc, e, out_of),
            reflections[variations[j]],
            cfg.memory_size,
            cfg.max_trajectory_chars,
          )
        )
      texts = writer(chats, k_refl) if chats else []
      for (j, _), text in zip(failed, texts):
        reflections[variations[j]].append((k, clean_reflection(text)))
    returns[k], successes[k] = last_return, solved
  return ReflexionResult(variations, returns, successes, reflections, prompts, ran)


__all__ = [
  "ReflexionConfig",
  "ReflexionResult",
  "memory_block",
  "trajectory_text",
  "reflection_messages",
  "clean_reflection",
  "policy_writer",
  "run",
]
