"""ctx_distill: on-policy context distillation of the memory (docs/methods.md, "Memory into
weights"; arXiv 2602.12275, Procedural Memory Distillation 2607.01480). On a memory iteration the
policy samples WITHOUT tips while the tips a memory step would show are retrieved and kept
("shadow retrieval", Actor.rollout's shadow_memory); each turn then gets a teacher view, its
tip-free chat with the tips retrieved at that step shown in its last user message (one block, as
the step's own memory lookup would show it; earlier steps' blocks are left out, which keeps the
teacher prompt within optim.max_prompt_len), and the loss adds the per-token reverse KL
KL(pi(.|s) || pi_old(.|s, tips)) (rl/teacher_terms.ctx_kl, weight loss.ctx_kl_coef) to GRPO's
term. Iterations without memory are plain on-policy updates. The teacher is the same model,
without gradient, at the weights the update starts from.

  ctx_distill.enabled     on while the method runs (the registry entry sets it)
  ctx_distill.edge_gate   EDGE's gate (arXiv 2608.21946): on a memory iteration each group's
                          first rollout.group_size // 2 rollouts see the tips and the rest sample
                          tip-free with shadow retrieval; the KL is applied to a group's tip-free
                          rollouts only where its tip half's mean return is higher. The tip half
                          trains as the iteration's mode says (EMPO2's off-policy update on an
                          "off" iteration). Needs rollout.group_size >= 2. [proposed: EDGE's
                          pruning of stale memory entries is not built]
"""

from __future__ import annotations

from empo2_jax.methods.base import Plugin, register
from empo2_jax.methods.teacher_views import report_teacher_views, set_teacher_chats


def teacher_chats(ctx, episodes) -> int:
  """Every turn whose step retrieved shadow tips gets its teacher chat: its chat with those tips
  in its last user message. Returns how many turns got one."""
  return sum(set_teacher_chats(ctx, e, e.shadow_tips) for e in episodes)


def edge_gate(episodes) -> tuple[list, dict]:
  """EDGE's gate over groups that mix tip-shown and tip-free (shadow) rollouts: (the tip-free
  episodes of the groups whose tip-shown half has the higher mean return, metrics). Episodes whose
  env failed count in neither half; a group missing a half stays closed."""
  groups: dict = {}
  for e in episodes:
    groups.setdefault(e.group_id, []).append(e)
  opened, gaps = [], []
  for grp in groups.values():
    shown = [e.episode_return for e in grp if e.use_memory and not e.env_failed]
    free = [e for e in grp if e.shadow_memory]
    free_ret = [e.episode_return for e in free if not e.env_failed]
    if not shown or not free_ret:
      continue
    gap = sum(shown) / len(shown) - sum(free_ret) / len(free_ret)
    gaps.append(gap)
    if gap > 0:
      opened.extend(free)
  n_open = len({e.group_id for e in opened})
  return opened, {
    "ctx_distill/edge_open_share": n_open / max(len(groups), 1),
    "ctx_distill/edge_gap_mean": sum(gaps) / len(gaps) if gaps else 0.0,
  }


class CtxDistill(Plugin):
  name = "ctx_distill"
  section = {"enabled": False, "edge_gate": False}

  def __init__(self, c, **kw):
    super().__init__(c, **kw)
    self.gate = bool(c.ctx_distill.edge_gate)

  def memory_view(self, mode: str):
    if mode == "on":
      return None
    return "split" if self.gate else "shadow"

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    if mode == "on":
      return episodes, {}
    metrics = {}
    taught = episodes
    if self.gate:
      taught, metrics = edge_gate(episodes)
    n = teacher_chats(ctx, taught)
    turns = sum(len(e.turns) for e in episodes if e.shadow_memory)
    shown = [len(t) for e in episodes for t in e.shadow_tips]
    if self.gate and taught is not episodes and not taught:  # the gate closed every group
      metrics["ctx_distill/plain_grpo"] = 1.0
    else:
      metrics.update(report_teacher_views(ctx, "ctx_distill", n, tips_read=True))
    return episodes, {
      "ctx_distill/teacher_turns": float(n),
      "ctx_distill/teacher_share": n / max(turns, 1),
      "ctx_distill/shadow_tips_mean": sum(shown) / max(len(shown), 1),
      **metrics,
    }


register(
  "ctx_distill",
  "On-policy context distillation: tip-free sampling, reverse KL to the model given the tips",
  overrides={"ctx_distill.enabled": True, "loss.ctx_kl_coef": 1.0},
  label="Ctx-distill",
  plugin=CtxDistill,
)

__all__ = ["CtxDistill", "edge_gate", "teacher_chats"]
