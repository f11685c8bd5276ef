"""Config sections of the exploration methods (added to the base config by empo2_jax/defaults.py)
and their checks. Every default marked [proposed] is a proposal of docs/methods.md, not a value
found in the authors' code.

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

INTRINSIC = (True, False, "count", "none", "rnd")
RND_ROLLOUTS = ("memory", "all")

# The sections below are the base config's (add_defaults); the methods' settings dataclasses
# (explore/rnd.py RNDConfig, sge.py SGEConfig, herl.py HeRLConfig) take their defaults from them.
RND = dict(
  hidden=256,  # [proposed] MLP 384 -> 256 -> 256 -> 128, ReLU, orthogonal(sqrt 2) init
  out=128,
  lr=1e-4,  # [proposed] Adam, one step per rollout batch over all visited states
  obs_clip=5.0,  # RND's clip of the normalised input
  normalise="minmax",  # [proposed] 'minmax' (batch -> [0, 1]), 'std' (RND's), 'none'
  gamma=0.99,  # RND's gamma_int (for 'std')
  # [proposed] which rollouts get the reward: 'memory' (where EMPO2 gives 1/(n+1), the
  # like-for-like ablation) or 'all'. The predictor trains on every iteration's states.
  rollouts="memory",
)
SGE = dict(
  enabled=False,
  # [proposed] temperature:share classes of a group's strategy spans (docs/methods.md §5.3)
  strategy_temperatures="1.0:0.5,1.3:0.25,1.6:0.25",
  # [proposed] the strategy phase's token budget, ADDED to rollout.max_new_tokens
  strategy_max_new_tokens=32,
  reflect_share=0.5,  # [proposed] rho
  reflect_history=3,  # [proposed] M
  reflect_from_iteration=1,  # [proposed] reflection from the second iteration on
)
HERL = dict(
  enabled=False,
  alpha=0.05,  # reward_shaping_alpha (HeRL scripts)
  gamma_s=1.0,  # he_shaping_gamma (HeRL's IF script)
  temperature=0.3,  # the rewrite temperature (HeRL scripts)
  max_actions_shown=12,  # [proposed] the failed attempt's last actions in the hindsight block
)
SPA = dict(
  enabled=False,
  # [proposed] stage A: iterations of rollout.rows_per_iter x group_size episodes of the
  # current policy in the world-model format (SPA: 5 batches of 256 episodes)
  collect_iterations=2,
  collect_temperature=1.0,  # SPA samples at temperature 1
  # [proposed] extra response tokens for <observation>/<prediction> (collection and RL, where
  # the SFT'd model keeps writing them), ADDED to rollout.max_new_tokens
  extra_new_tokens=96,
  val_share=0.2,  # SPA's 80/20 split
  sft_epochs=5,  # SPA's SFT epochs over the collected rows (0: config.sft.steps steps)
)


def add_defaults(c) -> None:
  """The explore sections of the base config (c unlocked)."""
  # True/False keep working; the field also takes the strings "count", "none", "rnd".
  c.empo2.intrinsic_reward = ml_collections.FieldReference(True, field_type=object)
  c.rnd = dict(RND)
  c.sge = dict(SGE)
  c.herl = dict(HERL)
  c.spa = dict(SPA)


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
