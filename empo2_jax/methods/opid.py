"""opid: the hindsight token advantage (docs/methods.md, "Memory into weights"; OPID,
arXiv 2606.26790). Sampling stays tip-free in every iteration. After the episode the policy (or
the rule reflector) writes its tip; each turn's teacher view is its own chat with that tip shown
in the turn's last user message, and the update adds, per response token,
opid_coef * (log pi_old(a | s, hindsight tip) - log pi_old(a | s)) to GRPO's advantage
(rl/teacher_terms.opid, weight loss.opid_coef) before the clipped surrogate.

  opid.enabled   on while the method runs (the registry entry sets it)
"""

from __future__ import annotations

from empo2_jax.methods.base import Plugin, register, set_teacher_chats


def hindsight_chats(ctx, episodes) -> int:
  """Every turn of an episode with a tip gets the teacher chat with that tip in its last user
  message; returns how many turns got one."""
  return sum(set_teacher_chats(ctx, e, [[e.tip]] * len(e.turns)) for e in episodes if e.tip)


class OPID(Plugin):
  name = "opid"
  section = {"enabled": False}

  def memory_view(self, mode: str):
    return "none"

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    n = hindsight_chats(ctx, episodes)
    turns = sum(len(e.turns) for e in episodes)
    return episodes, {"opid/teacher_turns": float(n), "opid/teacher_share": n / max(turns, 1)}


register(
  "opid",
  "OPID: tip-free sampling, the hindsight tip's log-prob gain as a token advantage",
  overrides={"opid.enabled": True, "loss.opid_coef": 1.0},
  label="OPID",
  plugin=OPID,
)

__all__ = ["OPID", "hindsight_chats"]
