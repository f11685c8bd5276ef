"""GRPO (Table 1): EMPO2's trainer without memory (p_memory = 0, so every iteration is on-policy
without tips) and without the low-probability mask; the `grpo_step` advantage."""

from __future__ import annotations

from empo2_jax.methods.base import GRPO_OVERRIDES, register

register(
  "grpo",
  "GRPO: EMPO2 without memory (p_memory = 0) and without the low-probability mask",
  overrides=GRPO_OVERRIDES,
  label="GRPO",
)
