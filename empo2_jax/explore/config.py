"""Config sections of the exploration methods (added to the base config by empo2_jax/defaults.py;
their default values are explore/sections.py's), their checks, and the methods' settings built
from them by name (rnd_config, sge_config, herl_config).

  empo2.intrinsic_reward  True / "count": EMPO2's memory reward scale/(n+1) (docs/method.md §3);
                          False / "none": no intrinsic reward; "rnd": RND (explore/rnd.py) in its
                          place, scaled by empo2.intrinsic_scale (the same knob)
  rnd.*                   the RND networks and normalisation (explore/rnd.py)
  sge.*                   strategy-guided exploration (explore/sge.py), on with sge.enabled
  herl.*                  hindsight-experience RL (explore/herl.py), on with herl.enabled
  spa.*                   self-play world-model SFT then RL (explore/spa.py, launch/spa.py)
"""

from __future__ import annotations

import dataclasses

import ml_collections

from empo2_jax.explore import sections

INTRINSIC = (True, False, "count", "none", "rnd")
RND_ROLLOUTS = ("memory", "all")


def add_defaults(c) -> None:
  """The explore sections of the base config (c unlocked)."""
  # True/False keep working; the field also takes the strings "count", "none", "rnd".
  c.empo2.intrinsic_reward = ml_collections.FieldReference(True, field_type=object)
  c.rnd = dict(sections.RND)
  c.sge = dict(sections.SGE)
  c.herl = dict(sections.HERL)
  c.spa = dict(sections.SPA)


def by_name(cls, section, **given):
  """A settings dataclass `cls` built by name: the config `section`'s keys that name one of its
  fields, under the same name, then `given` (fields the section does not hold, or values derived
  from it)."""
  fields = {f.name for f in dataclasses.fields(cls)}
  return cls(**{**{k: section[k] for k in section.keys() if k in fields}, **given})


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


def response_tokens(c) -> int:
  """The response budget of one turn: rollout.max_new_tokens plus SGE's strategy phase and SPA's
  world-model text when those methods are on (also the batch's response length)."""
  n = int(c.rollout.max_new_tokens)
  if c.sge.enabled:
    n += int(c.sge.strategy_max_new_tokens)
  if c.spa.enabled:
    n += int(c.spa.extra_new_tokens)
  return n


def check(c) -> None:
  """ValueError naming the valid values of a bad explore field."""
  intrinsic_kind(c)
  if c.rnd.rollouts not in RND_ROLLOUTS:
    raise ValueError(f"rnd.rollouts={c.rnd.rollouts!r}; valid: {', '.join(RND_ROLLOUTS)}")
  rnd_config(c)
  sge_config(c)
  herl_config(c)
  if sum(bool(x) for x in (c.sge.enabled, c.herl.enabled, c.spa.enabled)) > 1:
    raise ValueError("sge.enabled, herl.enabled and spa.enabled: at most one at a time")
  if c.spa.collect_iterations < 1 or not 0.0 <= c.spa.val_share < 1.0 or c.spa.sft_epochs < 0:
    raise ValueError(
      f"spa: need collect_iterations >= 1, 0 <= val_share < 1 and sft_epochs >= 0; got "
      f"{c.spa.collect_iterations}, {c.spa.val_share}, {c.spa.sft_epochs}"
    )


def rnd_config(c, **given):
  """The `rnd` section by name, the reward scale empo2.intrinsic_scale and the run's seed;
  `given`: the rest (input_dim: the encoder's width)."""
  from empo2_jax.explore import rnd

  return by_name(rnd.RNDConfig, c.rnd, scale=c.empo2.intrinsic_scale, seed=c.seed, **given)


def sge_config(c):
  """The `sge` section by name, its temperature classes parsed."""
  from empo2_jax.explore import sge

  return by_name(
    sge.SGEConfig,
    c.sge,
    strategy_temperatures=sge.parse_temperatures(c.sge.strategy_temperatures),
  )


def herl_config(c):
  """The `herl` section by name."""
  from empo2_jax.explore import herl

  return by_name(herl.HeRLConfig, c.herl)


__all__ = [
  "add_defaults",
  "by_name",
  "intrinsic_kind",
  "response_tokens",
  "check",
  "rnd_config",
  "sge_config",
  "herl_config",
]
