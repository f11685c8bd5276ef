"""Self-reflection tips (docs/method.md §2), as pure text functions: the chat a tip is written
from, its clean-up, and the memory entries it becomes.

After a training episode the policy reads its own trajectory plus one more user message (TIP_PROMPT;
`reflection_chat`, by `empo2.tip_chat`) and answers with a one-line tip (tips.clean_tip). Every
executed step t of the episode then becomes one memory entry (`memory_writes`):

    text  = "{tip}; At that timestep, the specific action you took was {a_t}; Eventually you got
    the score {R}/100."
    score = R (the episode return), key = the key text of step t, slot = (task, variation)

The key texts are the actor's (agent/actor.py: `empo2.memory_key`, `empo2.memory_key_text`). The
sampling is not here: agent/actor.Actor.reflect samples the tips of a rollout in one session call,
and memory/sync.gather_and_commit embeds the keys and adds the entries on every host.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from empo2_jax.tips import drop_tip_tags, strip_tips_messages

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}

TIP_PROMPT = (
  "The episode has ended. Reflect on the whole trajectory above: summarise what you tried, "
  "what you learned about this environment and task, and how close you came to finishing it, "
  "so that a later attempt can do better. Reply with a single line of fewer than 100 words and "
  "nothing else."
)


@dataclasses.dataclass(frozen=True)
class MemoryWrite:
  """One entry to store: `key` is the text to embed with the encoder."""

  slot: tuple[str, int]
  text: str
  score: float
  key: str


def with_tip_prompt(messages: Sequence[Message]) -> list[Message]:
  """`messages` and then the tip prompt: the chat the policy answers to write its tip."""
  return list(messages) + [{"role": "user", "content": TIP_PROMPT}]


TIP_CHATS = ("paper", "release", "outcome")


def reflection_chat(
  messages: Sequence[Message], variant: str, final_observation: str = "", outcome: str = ""
) -> list[Message]:
  """The chat a finished episode's tip is written from (`empo2.tip_chat`, docs/fidelity.md).

  messages: the episode's chat as sampled (user / assistant turns, memory turns with their tip
  blocks), ending with the last action.
    "paper"   (paper-era code) the tip-free history: tip blocks removed, the last observation
              not shown, no score; then the tip prompt.
    "release" (release code) the history with each turn's tips as plain text (tags dropped),
              then the last observation as a user message, then the tip prompt.
    "outcome" (ours) the history as sampled, tip blocks kept; the last user message is
              `outcome` (the last observation and the final score) + the tip prompt.
  """
  if variant == "paper":
    return with_tip_prompt(strip_tips_messages(messages))
  if variant == "release":
    chat = [dict(m, content=drop_tip_tags(m["content"])) for m in messages]
    return with_tip_prompt(chat + [{"role": "user", "content": final_observation.strip()}])
  if variant == "outcome":
    chat = with_tip_prompt(messages)
    chat[-1] = {"role": "user", "content": outcome + chat[-1]["content"]}
    return chat
  raise ValueError(f"tip_chat={variant!r}; valid: {', '.join(TIP_CHATS)}")


def format_score(score: float) -> str:
  s = float(score)
  return str(int(s)) if s.is_integer() else f"{s:.2f}".rstrip("0").rstrip(".")


def memory_text(tip: str, action: str, score: float, out_of: float | None = 100) -> str:
  """out_of: the score's maximum ("/100" for ScienceWorld); None: a return without one."""
  of = f"/{format_score(out_of)}" if out_of else ""
  return (
    f"{tip}; At that timestep, the specific action you took was {action}; "
    f"Eventually you got the score {format_score(score)}{of}."
  )


def memory_writes(
  slot: tuple[str, int],
  tip: str,
  actions: Sequence[str],
  keys: Sequence[str],
  score: float,
  out_of: float | None = 100,
) -> list[MemoryWrite]:
  """The memory entries of one episode: one per executed action a_t, its text
  memory_text(tip, a_t, score), keyed by keys[t]; none for an empty tip."""
  if not tip:
    return []
  return [
    MemoryWrite(slot, memory_text(tip, action, score, out_of), score, key)
    for action, key in zip(actions, keys)
  ]
