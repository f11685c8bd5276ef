"""empo2_release: EMPO2 as the authors shipped it (microsoft/agent-lightning 0b40cb72,
`empo2_qwen_7b_instruct.yaml` with the recipe's daemon and trainer; docs/fidelity.md). What it
sets, against our paper-era defaults:

  empo2.ratio_variant=release     the old log-prob of an off-policy sample recomputed on the
                                  prompt WITH tips (the current one on the tip-free prompt)
  loss.low_prob_mask=False        USE_LOW_PROB_MASKING: false
  advantage.estimator=grpo_rollout  one score per rollout, normalised over the group (ddof 1)
  empo2.intrinsic_reward=False    the release adds 1/(n+1) to the rewards but its advantage reads
                                  the scores, so the memory reward never reaches the update
  empo2.memory_key=final          every step's memory keyed by the episode's final chat
  empo2.tip_chat=release          tips written from the chat with tips as plain text
  empo2.tip_max_new_tokens=512    the tip's sampling budget
  optim.prompt_len_check=sampled  a sample is dropped when its prompt as sampled (tips included)
                                  plus its response exceeds optim.max_prompt_len

Not reproduced: the release drops over-long samples before its advantages (here after), and its
tip removal misses the current step's tip block (docs/fidelity.md, "Tips in the prompt").
"""

from __future__ import annotations

from empo2_jax.methods.base import register

OVERRIDES = {
  "empo2.ratio_variant": "release",
  "loss.low_prob_mask": False,
  "advantage.estimator": "grpo_rollout",
  "empo2.intrinsic_reward": False,
  "empo2.memory_key": "final",
  "empo2.tip_chat": "release",
  "empo2.tip_max_new_tokens": 512,
  "optim.prompt_len_check": "sampled",
}

register(
  "empo2_release",
  "EMPO2 as the authors shipped it: release ratio, no mask, rollout-level advantage",
  overrides=OVERRIDES,
  label="EMPO2 (release)",
)

__all__ = ["OVERRIDES"]
