"""ctx_distill: on-policy context distillation of the memory (docs/methods.md, "Memory into
weights"; arXiv 2602.12275, Procedural Memory Distillation 2607.01480). On a memory iteration the
policy samples WITHOUT tips while the tips a memory step would show are retrieved and kept
("shadow retrieval", Actor.rollout's shadow_memory); each turn then gets a teacher view, its
tip-free chat with the tips retrieved at that step shown in its last user message (one block, as
the step's own memory lookup would show it; earlier steps' blocks are left out, which keeps the
teacher prompt within optim.max_prompt_len), and the loss adds the per-token reverse KL
KL(pi(.|s) || pi_old(.|s, tips)) (rl/loss_terms.ctx_kl, weight loss.ctx_kl_coef) to GRPO's
term. Iterations without memory are plain on-policy updates. The teacher is the same model,
without gradient, at the weights the update starts from.

  ctx_distill.enabled   on while the method runs (the registry entry sets it)

Not built: EDGE's gate (2608.21946: each group's rollouts split with and without memory, the KL
applied only where the memory half scored higher) needs groups mixing both kinds of rollout,
which the actor does not draw yet.
"""

from __future__ import annotations

from empo2_jax.methods.base import Plugin, register, set_teacher_chats


def teacher_chats(ctx, episodes) -> int:
  """Every turn whose step retrieved shadow tips gets its teacher chat: its chat with those tips
  in its last user message. Returns how many turns got one."""
  return sum(set_teacher_chats(ctx, e, e.shadow_tips) for e in episodes)


class CtxDistill(Plugin):
  name = "ctx_distill"
  section = {"enabled": False}

  def memory_view(self, mode: str):
    return None if mode == "on" else "shadow"

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    if mode == "on":
      return episodes, {}
    n = teacher_chats(ctx, episodes)
    turns = sum(len(e.turns) for e in episodes)
    shown = [len(t) for e in episodes for t in e.shadow_tips]
    return episodes, {
      "ctx_distill/teacher_turns": float(n),
      "ctx_distill/teacher_share": n / max(turns, 1),
      "ctx_distill/shadow_tips_mean": sum(shown) / max(len(shown), 1),
    }


register(
  "ctx_distill",
  "On-policy context distillation: tip-free sampling, reverse KL to the model given the tips",
  overrides={"ctx_distill.enabled": True, "loss.ctx_kl_coef": 1.0},
  label="Ctx-distill",
  plugin=CtxDistill,
)

__all__ = ["CtxDistill", "teacher_chats"]
