"""Self-reflection tips (docs/method.md §2): prompt, clean-up, stored text, and the batched
`reflect` call.

After a training episode the policy reads its own trajectory plus one more user message (TIP_PROMPT)
and answers with a one-line tip. Every step t of the episode then becomes one memory entry:

    text  = "{tip}; At that timestep, the specific action you took was {a_t}; Eventually you got
    the score {R}/100."
    score = R (the episode return), key = MiniLM(key text of step t), slot = (task, variation)

Key text = the chat so far, system message excluded, as "user: ..." / "assistant: ..." lines
(`key_text`). key_mode "step" (paper-era code) keys step t by the transcript up to and including the
user message that step t answered; "final" (release code) keys every step by the whole transcript.

The sampler is not imported here: `reflect(episodes, generate_fn)` takes a callable
`generate_fn(list_of_chat_message_lists) -> list[str]` (one completion per chat, temperature and
token
limit are the caller's) and calls it ONCE for all episodes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

import numpy as np

from empo2_jax.envs.actions import printable_text
from empo2_jax.rl.batch import strip_tips_messages

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}

TIP_PROMPT = (
  "The episode has ended. Reflect on the whole trajectory above: summarise what you tried, "
  "what you learned about this environment and task, and how close you came to finishing it, "
  "so that a later attempt can do better. Reply with a single line of fewer than 100 words and "
  "nothing else."
)
MAX_TIP_WORDS = 99  # "< 100 words"

_MARKUP = re.compile(r"<\|[^|>]*\|>|</?tip>")  # <|im_start|>, <|im_end|>, <|endoftext|>, ...
_ROLE_AFTER_START = re.compile(r"<\|im_start\|>\s*(system|user|assistant)\b", re.I)
_LABEL = re.compile(r"^\s*(?:\*\*)?(?:tip|summary|reflection)(?:\*\*)?\s*[:\-]\s*", re.I)


@dataclasses.dataclass
class ReflectEpisode:
  """What reflection needs from a finished episode (the actor's Episode can convert to this).

  slot:     (task name, variation index) -- the memory list the tips go to.
  messages: the full chat as the policy saw it: optional system message, then user (observation) and
            assistant (raw model action text) turns alternating; a final user message with the last
            observation may follow the last assistant turn.
  actions:  the action of each step, in order (len == number of assistant turns); this is the a_t
            quoted in the stored text (pass the corrected, executed action if that is what you
            want).
  score:    the episode return R (the final ScienceWorld score; -100 on failure).
  """

  slot: tuple[str, int]
  messages: list[Message]
  actions: list[str]
  score: float


@dataclasses.dataclass(frozen=True)
class MemoryWrite:
  """One entry to store: `key` is the text to embed with the encoder."""

  slot: tuple[str, int]
  text: str
  score: float
  key: str


def key_text(messages: Sequence[Message]) -> str:
  """The retrieval key of a chat prefix: "role: content" lines, system messages dropped."""
  return "\n".join(f"{m['role']}: {m['content']}" for m in messages if m["role"] != "system")


def tip_chat(messages: Sequence[Message]) -> list[Message]:
  """The chat the policy answers to write its tip."""
  return list(messages) + [{"role": "user", "content": TIP_PROMPT}]


TIP_CHATS = ("paper", "release", "outcome")
_TIP_TAG = re.compile(r"<tip> ?|</tip>")


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
    return tip_chat(strip_tips_messages(messages))
  if variant == "release":
    chat = [dict(m, content=_TIP_TAG.sub("", m["content"])) for m in messages]
    return tip_chat(chat + [{"role": "user", "content": final_observation.strip()}])
  if variant == "outcome":
    chat = tip_chat(messages)
    chat[-1] = {"role": "user", "content": outcome + chat[-1]["content"]}
    return chat
  raise ValueError(f"tip_chat={variant!r}; valid: {', '.join(TIP_CHATS)}")


def clean_tip(raw: str, max_words: int = MAX_TIP_WORDS) -> str:
  """One line, no chat markup or tip tags, at most `max_words` words; "" when nothing usable is
  left.

  Tip tags are removed so a stored tip can never close a tip block early (rl.batch.strip_tips).
  """
  # Printable text first, line by line (control characters include the line breaks): a stored
  # tip must encode as UTF-8 (checkpoints), and an invisible character inside a tag ("<ti\u200bp>")
  # must not turn into a tag after the markup is gone.
  text = "\n".join(printable_text(ln) for ln in str(raw).splitlines())
  text = _ROLE_AFTER_START.sub(" ", text)
  text = _MARKUP.sub(" ", text)
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  if not lines:
    return ""
  line = _LABEL.sub("", lines[0]).strip().strip('"').strip()
  words = line.split()
  return " ".join(words[:max_words])


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


def step_keys(messages: Sequence[Message], n_steps: int, key_mode: str = "step") -> list[str]:
  """Key text per step: "step" = chat up to the user message step t answered; "final" = whole
  chat."""
  if key_mode == "final":
    return [key_text(messages)] * n_steps
  if key_mode != "step":
    raise ValueError(f"key_mode must be 'step' or 'final', got {key_mode!r}")
  assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  if len(assistant_at) != n_steps:
    raise ValueError(f"episode has {len(assistant_at)} assistant turns but {n_steps} actions")
  return [key_text(messages[:i]) for i in assistant_at]


def reflect(
  episodes: Sequence[ReflectEpisode],
  generate_fn: Callable[[list[list[Message]]], list[str]],
  key_mode: str = "step",
  max_words: int = MAX_TIP_WORDS,
) -> tuple[list[str], list[MemoryWrite]]:
  """Write a tip for every episode with ONE generate_fn call; returns (tips, memory writes).

  Episodes whose cleaned tip is empty contribute no writes (their tip is returned as "").
  """
  episodes = list(episodes)
  if not episodes:
    return [], []
  raw = generate_fn([tip_chat(ep.messages) for ep in episodes])
  if len(raw) != len(episodes):
    raise ValueError(f"generate_fn returned {len(raw)} completions for {len(episodes)} chats")
  tips = [clean_tip(r, max_words) for r in raw]
  writes = []
  for ep, tip in zip(episodes, tips):
    if not tip:
      continue
    for action, key in zip(ep.actions, step_keys(ep.messages, len(ep.actions), key_mode)):
      writes.append(
        MemoryWrite(tuple(ep.slot), memory_text(tip, action, ep.score), float(ep.score), key)
      )
  return tips, writes


def commit(store, encoder, writes: Sequence[MemoryWrite], iteration: int) -> list[int | None]:
  """Embed the writes' keys with `encoder` (Encoder.encode) and add them to `store` (MemoryStore).

  Returns each write's uid, None where the slot already held that text.
  """
  if not writes:
    return []
  emb_nd = encoder.encode([w.key for w in writes])
  return store.add_many(
    [w.slot for w in writes],
    [w.text for w in writes],
    [w.score for w in writes],
    np.asarray(emb_nd, np.float32),
    iteration,
  )
