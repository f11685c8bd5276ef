"""The config's sections as the settings objects of the kernels: the update (rl/update.py), the
batch builder (rl/batch.py) and the actor (agent/actor.py)."""

from __future__ import annotations

from empo2_jax.agent.actor import ActorSettings
from empo2_jax.rl import batch as batch_lib
from empo2_jax.rl import update as update_lib
from empo2_jax.rl.losses import LossConfig
from empo2_jax.train import build


def update_config(c) -> update_lib.UpdateConfig:
  return update_lib.UpdateConfig(
    learning_rate=c.optim.lr,
    weight_decay=c.optim.weight_decay,
    adam_b1=c.optim.b1,
    adam_b2=c.optim.b2,
    max_grad_norm=c.optim.grad_clip,
    minibatch_size=c.optim.minibatch_size,
    micro_rows=c.optim.micro_rows,
    ppo_epochs=c.optim.epochs,
    temperature=c.rollout.temperature,
    loss=LossConfig(
      clip_eps_low=c.loss.eps_low,
      clip_eps_high=c.loss.eps_high,
      dual_clip_c=c.loss.dual_clip or None,
      agg=c.loss.agg,
      kl_coef=c.loss.kl_coef,
      kl_type=build.kl_type(c.loss.kl_estimator),
      entropy_coef=c.loss.entropy_coef,
      low_prob_mask=c.loss.low_prob_mask,
      low_prob_delta=c.loss.low_prob_delta,
    ),
  )


def batch_config(c, pad_id: int) -> batch_lib.BatchConfig:
  """rl/minibatch.arrange then lays out the update's rows."""
  return batch_lib.BatchConfig(
    max_prompt_len=c.optim.max_prompt_len,
    response_len=c.rollout.max_new_tokens,
    ratio_variant=c.empo2.ratio_variant,
    pad_id=pad_id,
    prompt_len_check=c.optim.prompt_len_check,
    row_multiple=c.optim.micro_rows,
  )


def actor_settings(c) -> ActorSettings:
  return ActorSettings(
    max_new_tokens=c.rollout.max_new_tokens,
    max_context=c.rollout.max_context,
    top_p=c.rollout.top_p,
    top_k=c.rollout.top_k,
    tip_max_new_tokens=c.empo2.tip_max_new_tokens,
    tip_temperature=c.empo2.tip_temperature,
    intrinsic_scale=c.empo2.intrinsic_scale,
    intrinsic_reward=c.empo2.intrinsic_reward,
    memory_key=c.empo2.memory_key,
    memory_key_text=c.empo2.memory_key_text,
    cache_dtype=c.rollout.cache_dtype,
  )
