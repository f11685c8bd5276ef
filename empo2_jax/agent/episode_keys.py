"""Per-episode sampling keys for the actor's session (multi-host reproducibility)."""

from __future__ import annotations

from typing import Sequence

from empo2_jax.sampling.sampler import row_keys


class EpisodeKeys:
  """A sampling Engine whose decode draws row r with fold_in(step_key, episode_ids[r]).

  Session.step draws row r with fold_in(rng, r), r being a slot of this host's session; on a pod
  the same episode would then sample differently depending on the host that runs it. The actor
  sets `step_key` before each call (`Actor.sample`) and rows draw with keys folded from their
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
      raise RuntimeError("EpisodeKeys.decode before step_key was set (use Actor.sample)")
    keys = self._engine.place_rows(row_keys(self.step_key, self._ids))
    return self._engine.decode(params, cache, hidden, length, active, keys, **kwargs)
