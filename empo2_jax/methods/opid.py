"""opid: the hindsight token advantage (docs/methods.md, "Memory into weights"; OPID,
arXiv 2606.26790). Sampling stays tip-free in every iteration. After the episode the policy (or
the rule reflector) writes its tip; each turn's teacher view is its own chat with that tip shown
in the turn's last user message, and the update adds, per response token,
opid_coef * (log pi_old(a | s, hindsight tip) - log pi_old(a | s)) to GRPO's advantage
(rl/teacher_terms.opid, weight loss.opid_coef; loss.opid_norm) before the clipped surrogate.

  opid.enabled      on while the method runs (the registry entry sets it)
  opid.tip_source   "episode" (OPID's): the episode's own tip, written after it; "memory" (ours):
                    the memory's tips for each step, retrieved while sampling tip-free (shadow
                    retrieval, as ctx_distill's teacher; iterations of mode "on" have none), so
                    the hindsight is what the memory knows (the vault bench's oracle tips)
"""

from __future__ import annotations

from empo2_jax.methods.base import Plugin, register
from empo2_jax.methods.teacher_views import report_teacher_views, set_teacher_chats


def hindsight_chats(ctx, episodes) -> int:
  """Every turn of an episode with a tip gets the teacher chat with that tip in its last user
  message; returns how many turns got one."""
  return sum(set_teacher_chats(ctx, e, [[e.tip]] * len(e.turns)) for e in episodes if e.tip)


TIP_SOURCES = ("episode", "memory")


class OPID(Plugin):
  name = "opid"
  section = {"enabled": False, "tip_source": "episode"}

  @classmethod
  def check(cls, c) -> None:
    if c.opid.tip_source not in TIP_SOURCES:
      raise ValueError(f"opid.tip_source={c.opid.tip_source!r}; valid: {', '.join(TIP_SOURCES)}")

  def __init__(self, c, **kw):
    super().__init__(c, **kw)
    self.from_memory = c.opid.tip_source == "memory"

  def memory_view(self, mode: str):
    return "shadow" if self.from_memory and mode != "on" else "none"

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    if self.from_memory:
      if mode == "on":
        return episodes, {}
      n = sum(set_teacher_chats(ctx, e, e.shadow_tips) for e in episodes)
    else:
      n = hindsight_chats(ctx, episodes)
    turns = sum(len(e.turns) for e in episodes)
    return episodes, {
      "opid/teacher_turns": float(n),
      "opid/teacher_share": n / max(turns, 1),
      **report_teacher_views(ctx, "opid", n, tips_read=self.from_memory),
    }


register(
  "opid",
  "OPID: tip-free sampling, the hindsight tip's log-prob gain as a token advantage",
  overrides={"opid.enabled": True, "loss.opid_coef": 1.0},
  label="OPID",
  plugin=OPID,
)

__all__ = ["OPID", "TIP_SOURCES", "hindsight_chats"]
