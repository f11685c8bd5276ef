"""GiGPO (Table 2), as verl-agent runs it: GRPO's update with the group-in-group advantage
(rl/advantages.gigpo_advantages, docs/methods.md §7.5), no memory. Its settings are the
`advantage` section's, so it is overrides only."""

from __future__ import annotations

from empo2_jax.methods.base import GRPO_OVERRIDES, register


def overrides(use_std: bool) -> dict:
  return {
    **GRPO_OVERRIDES,
    "advantage.estimator": "gigpo",
    "advantage.gamma": 0.95,
    "advantage.step_weight": 1.0,
    "advantage.use_std": use_std,
    "advantage.episode_stats": "steps",
    "advantage.invalid_penalty": 0.1,
  }


register(
  "gigpo",
  "GiGPO as verl-agent runs it (F_norm = 1, mean_norm), no memory",
  overrides=overrides(False),
  label="GiGPO w/o std",
)
register(
  "gigpo_std",
  "GiGPO with std normalisation (mean_std_norm), no memory",
  overrides=overrides(True),
  label="GiGPO w/ std",
)
