"""A whole method in one file, as docs/architecture.md "How to add a method" writes it: a config
section, a check, a hook, and its registry entry. tests/methods/test_toy_method.py imports it."""

from empo2_jax import methods


class ToyBonus(methods.Plugin):
  """Adds `toy_bonus.bonus` to every trained turn's intrinsic reward after the rollout."""

  name = "toy_bonus"
  section = {"enabled": False, "bonus": 0.5}  # on while toy_bonus.enabled (Plugin.active)

  @classmethod
  def check(cls, c):
    if c.toy_bonus.bonus < 0:
      raise ValueError(f"toy_bonus.bonus={c.toy_bonus.bonus}: must be >= 0")

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    n = 0
    for e in episodes:
      for t in e.turns:
        t.intrinsic += float(self.c.toy_bonus.bonus)
        n += 1
    return episodes, {"toy_bonus/turns": n}


methods.register(
  "toy_bonus",
  "a toy: GRPO plus a constant intrinsic bonus on every turn",
  overrides={**methods.GRPO_OVERRIDES, "toy_bonus.enabled": True},
  plugin=ToyBonus,
)
