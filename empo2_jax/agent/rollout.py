"""What `Actor.rollout` returns (`Rollout`) and the counters it sums over hosts; how a per-episode
flag is read (`per_spec`)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax

from empo2_jax.agent.episode import Episode
from empo2_jax.sampling.session import Session

SESSION_COUNTERS = ("prefill_tokens", "reused_tokens", "truncations")


@dataclasses.dataclass
class Rollout:
  """What `Actor.rollout` returns.

  episodes: every host's episodes, in spec order.
  stats:    retrieved (tips shown), memory_steps, steps, prefill_tokens, reused_tokens and
            truncations, summed over hosts; time/rollout_{sampling,env,tokenize,retrieval}: this
            host's wall-clock phases.
  Until `close()`, this host's sampler session stays open with its episodes (`own`, the
  session's rows in order) and their chats' token ids, for `Actor.reflect`; `tip_key` is the key
  the tips draw with.
  """

  episodes: list
  stats: dict
  own: list = dataclasses.field(default_factory=list)
  chats: list = dataclasses.field(default_factory=list)  # ChatTokens per row of `own`
  session: Optional[Session] = None
  tip_key: Optional[jax.Array] = None

  def close(self) -> None:
    """Free the sampler session (its KV cache)."""
    self.session, self.chats = None, []


def per_spec(flag, n: int, name: str) -> list[bool]:
  """One bool, or a sequence of n, as n bools (ValueError naming `name` otherwise)."""
  if not isinstance(flag, (list, tuple)):
    return [bool(flag)] * n
  flags = [bool(f) for f in flag]
  if len(flags) != n:
    raise ValueError(f"{name}: {len(flags)} flags for {n} episodes")
  return flags


def step_counts(episodes: Sequence[Episode]) -> dict:
  """The rollout's counters: tips shown (retrieved), memory steps (steps of episodes shown
  tips) and steps."""
  return {
    "retrieved": sum(sum(e.retrieved) for e in episodes),
    "memory_steps": sum(len(e.turns) for e in episodes if e.use_memory),
    "steps": sum(len(e.turns) for e in episodes),
  }


__all__ = ["Rollout", "SESSION_COUNTERS", "per_spec", "step_counts"]
