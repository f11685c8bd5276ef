"""The teacher views of the distillation methods (ctx_distill, opid): each turn's chat with the
tips its teacher shows (set_teacher_chats), and what a method reports when it built none
(report_teacher_views). The loss terms that read them: rl/teacher_terms.py."""

from __future__ import annotations

import logging

from empo2_jax.methods.base import RolloutContext


class NoTeacherError(RuntimeError):
  """A distillation method's memory held tips, yet no step of the iteration retrieved one."""


_WARNED_NO_TEACHER: set = set()


def report_teacher_views(ctx: RolloutContext, name: str, n_views: int, tips_read: bool) -> dict:
  """What a distillation method (ctx_distill, opid) says after building its teacher views: with
  none, its loss term adds nothing and the iteration trains plain GRPO. The metric
  {name}/plain_grpo says so every time, the log once a run. `tips_read`: the teacher reads the
  memory's tips; then empty slots are the reason (a memory still being built), while slots that
  held tips when the rollout began (ctx.memory_entries), none of which a step retrieved, are a
  NoTeacherError (memory.threshold or memory.top_k do not fit the run)."""
  if n_views:
    return {f"{name}/plain_grpo": 0.0}
  held = (ctx.memory_entries or 0) if tips_read else 0
  if held:
    raise NoTeacherError(
      f"{name}: this iteration's memory slots held {held} tips but no step retrieved any, so no "
      "teacher view was built; check memory.threshold and memory.top_k"
    )
  if name not in _WARNED_NO_TEACHER:
    _WARNED_NO_TEACHER.add(name)
    why = "the iteration's memory slots were empty" if tips_read else "no episode had a tip"
    logging.getLogger("empo2_jax").warning(
      "%s: no teacher view this iteration (%s): its loss term adds nothing and the update is "
      "plain GRPO (metric %s/plain_grpo; logged once)", name, why, name,
    )  # fmt: skip
  return {f"{name}/plain_grpo": 1.0}


def set_teacher_chats(ctx: RolloutContext, episode, tips_by_turn) -> int:
  """Each turn k of `episode` with tips_by_turn[k] non-empty gets its teacher chat: its own chat
  with those tips in its last user message (ctx.chats_with_tips). Returns how many turns got
  one (methods/ctx_distill.py, methods/opid.py)."""
  n, steps = 0, len(episode.turns)
  for k, turn in enumerate(episode.turns):
    if k >= len(tips_by_turn) or not tips_by_turn[k]:
      continue
    tips = [[] for _ in range(steps)]
    tips[k] = list(tips_by_turn[k])
    (turn.teacher_messages,) = ctx.chats_with_tips(episode, tips, turns=[k])
    n += 1
  return n


__all__ = ["NoTeacherError", "set_teacher_chats", "report_teacher_views"]
