"""EMPO2 (docs/method.md): its config section `empo2` and its checks. The method itself (memory,
tips, the three update modes) is the trainer's core (train/trainer.py, agent/actor.py,
rl/batch.py), so its plugin adds no hooks; GRPO is EMPO2 with p_memory = 0 (methods/grpo.py).

  empo2.intrinsic_reward  True / "count": EMPO2's memory reward scale/(n+1) (docs/method.md §3);
                          False / "none": no intrinsic reward; "rnd": RND (methods/rnd.py) in
                          its place, scaled by empo2.intrinsic_scale (the same knob)
"""

from __future__ import annotations

import ml_collections

from empo2_jax.methods.base import Plugin, register
from empo2_jax.rl import batch as batch_lib

# empo2.force_mode: "" (draw the mode each iteration) or one of the update's modes
FORCE_MODES = ("",) + batch_lib.MODES
INTRINSIC = (True, False, "count", "none", "rnd")


def section() -> dict:
  """The `empo2` section's defaults (empo2_jax/defaults.py puts it in the base config)."""
  return dict(
    p_memory=0.25,  # probability that an iteration rolls out with memory tips
    q_offpolicy=2.0 / 3.0,  # share of memory iterations updated off-policy (tips removed)
    force_mode="",  # '', 'on', 'on_tips' or 'off': skip the draw (tests, ablations)
    ratio_variant="paper",  # 'paper' or 'release' old-log-prob view (docs/method.md §4)
    # True/'count', False/'none', or 'rnd' (intrinsic_kind below); True/False keep working, so
    # the field takes any type
    intrinsic_reward=ml_collections.FieldReference(True, field_type=object),
    intrinsic_scale=1.0,
    tip_max_new_tokens=128,
    tip_temperature=1.0,
    memory_key="step",  # 'step' (paper-era: each step's transcript) or 'final' (release)
    # 'chat' (the authors' code, both versions: the tip-free chat so far as MiniLM sees it, its
    # first 256 word pieces) or 'recent' (ours: task + latest lines); agent/actor.py
    memory_key_text="chat",
    # The chat a tip is written from: 'paper' (paper-era: tip-free history, no last observation,
    # no score), 'release' (tips as plain text, the last observation) or 'outcome' (ours: tips
    # kept, the last observation and the final score); memory/reflect.reflection_chat
    tip_chat="paper",
    # Who writes the tip: "policy" (the method) or "rule" (a mechanism check: the score-raising
    # actions and the unmet subgoals, no model; memory/rule_tip.py)
    reflector="policy",
  )


def intrinsic_kind(c) -> str:
  """'count', 'none' or 'rnd' for config.empo2.intrinsic_reward."""
  v = c.empo2.intrinsic_reward
  if v is True or v == "count":
    return "count"
  if v is False or v == "none":
    return "none"
  if v == "rnd":
    return "rnd"
  raise ValueError(
    f"empo2.intrinsic_reward={v!r}; valid: True or 'count' (EMPO2's 1/(n+1)), False or 'none', "
    "'rnd'"
  )


class EMPO2(Plugin):
  name = "empo2"  # its section is placed by defaults.py, among the base config's (section())

  @classmethod
  def add_defaults(cls, c) -> None:
    if "empo2" not in c:
      c.empo2 = section()

  @classmethod
  def check(cls, c) -> None:
    e = c.empo2
    if e.force_mode not in FORCE_MODES:
      raise ValueError(f"empo2.force_mode={e.force_mode!r}; valid: {FORCE_MODES}")
    # ratio_variant, memory_key, memory_key_text, tip_chat and reflector are checked where their
    # settings are defined (rl/batch.BatchConfig, agent/episode.ActorSettings), when
    # train/build.check_config builds those objects.
    for name in ("p_memory", "q_offpolicy"):
      if not 0.0 <= e[name] <= 1.0:
        raise ValueError(f"empo2.{name}={e[name]} must be in [0, 1]")
    intrinsic_kind(c)


register(
  "empo2",
  "EMPO2: memory-augmented exploration, on- and off-policy updates",
  label="EMPO2",
  plugin=EMPO2,
)

__all__ = ["FORCE_MODES", "INTRINSIC", "section", "intrinsic_kind", "EMPO2"]
