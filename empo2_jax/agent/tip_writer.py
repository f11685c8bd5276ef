"""The rollout's tips into memory (docs/method.md §2-3), what `Actor.reflect` does: the policy
writes each finished episode's tip with one more call on the rollout's open session (from the
chat `Actor.tip_writing_chat` builds; empo2.reflector="rule": memory/rule_tip.py writes them and
nothing is sampled), each cleaned tip becomes one memory write per executed step
(memory/reflect.memory_writes, keyed by empo2.memory_key), and memory/sync.gather_and_commit adds
every host's writes in process order.

    stats = reflect(actor, rollout, iteration)     # = actor.reflect(rollout, iteration)
"""

from __future__ import annotations

import time
from typing import Sequence

from empo2_jax.agent import hosts
from empo2_jax.agent.episode import Episode
from empo2_jax.agent.rollout import Rollout
from empo2_jax.memory.reflect import memory_writes
from empo2_jax.memory.rule_tip import episode_rule_tip
from empo2_jax.memory.sync import gather_and_commit
from empo2_jax.tips import clean_tip


def reflect(actor, rollout: Rollout, iteration: int) -> dict:
  """The tips of the rollout's finished episodes, into memory on every host (the module
  docstring). Sets every episode's `tip`. A collective: every process calls it, also one without
  episodes. Returns {"tips", "memory_writes", "time/rollout_reflect"} (tips summed over hosts).
  """
  if actor.memory is None:
    raise ValueError("Actor.reflect needs an Actor built with a Memory")
  t0 = time.perf_counter()
  own = rollout.own
  todo = [i for i, e in enumerate(own) if e.turns and not e.env_failed]
  raw = sample_tips(actor, rollout, todo) if actor.settings.reflector == "policy" else {}
  writes = []
  for i in todo:
    e = own[i]
    e.tip = clean_tip(raw[i] if i in raw else episode_rule_tip(e))
    slot, out_of = (e.task, e.variation), actor.prompts.score_out_of
    writes += memory_writes(slot, e.tip, e.executed, write_keys(actor, e), e.score, out_of)
  if actor.settings.memory_frozen:  # memory.frozen: the episodes keep their tips, memory as is
    writes = []
  _, uids = gather_and_commit(actor.memory.store, actor.memory.encoder, writes, iteration)
  for e, tip in zip(rollout.episodes, hosts.gather_values([e.tip for e in own])):
    e.tip = tip
  stats = {
    "tips": sum(1 for i in todo if own[i].tip),
    "memory_writes": sum(u is not None for u in uids),
    "time/rollout_reflect": time.perf_counter() - t0,
  }
  return hosts.sum_stats(stats, same_on_all_hosts=("memory_writes", "time/rollout_reflect"))


def sample_tips(actor, rollout: Rollout, rows: Sequence[int]) -> dict:
  """{row: the policy's raw tip}: one call on the rollout's session; row i draws with
  fold_in(tip_key, episode index)."""
  if not rows:
    return {}
  if rollout.session is None:
    raise ValueError("Actor.reflect needs the rollout's session: reflect before Rollout.close()")
  s = actor.settings
  requests = {i: rollout.chats[i].tokens(actor.tip_writing_chat(rollout.own[i])) for i in rows}
  out = actor.sample(
    rollout.session,
    requests,
    rollout.tip_key,
    max_new_tokens=s.tip_max_new_tokens,
    temperature=s.tip_temperature,
  )
  return {i: actor.tok.decode(out[i][0], skip_special_tokens=True) for i in rows}


def write_keys(actor, e: Episode) -> list[str]:
  """The key of each executed step's memory: the key its step retrieved with ("step"), or the
  key of the episode's end ("final")."""
  if actor.settings.memory_key == "step":
    return e.step_keys
  final = e.final_observation if actor.settings.memory_key_text == "recent" else None
  return [actor.key_text(e, final)] * len(e.executed)
