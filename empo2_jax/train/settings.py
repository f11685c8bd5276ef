"""The config's sections as the settings objects of the kernels: the update (rl/update.py), the
batch builder (rl/batch.py) and the actor (agent/actor.py)."""

from __future__ import annotations

import dataclasses

from empo2_jax.agent.actor import ActorSettings
from empo2_jax import methods
from empo2_jax.config_keys import by_name
from empo2_jax.methods.empo2 import intrinsic_kind
from empo2_jax.rl import advantages as adv_lib
from empo2_jax.rl import batch as batch_lib
from empo2_jax.rl import loss_terms
from empo2_jax.rl import minibatch as minibatch_lib
from empo2_jax.rl import update as update_lib
from empo2_jax.rl.losses import LossConfig


def loss_config(c) -> LossConfig:
  """The `loss` section, key for key: LossConfig's fields, and the registered loss terms' own
  keys (rl/loss_terms.py) in LossConfig.terms."""
  fields = {f.name for f in dataclasses.fields(LossConfig)} - {"terms"}
  terms = tuple(sorted((k, c.loss[k]) for k in c.loss.keys() if k not in fields))
  loss_terms.check_values({k: c.loss[k] for k in c.loss.keys()})  # each term checks its keys
  return LossConfig(**{k: c.loss[k] for k in c.loss.keys() if k in fields}, terms=terms)


def update_config(c) -> update_lib.UpdateConfig:
  """The `optim` keys of the update, rollout.temperature and the loss section."""
  return by_name(
    update_lib.UpdateConfig,
    c.optim,
    temperature=c.rollout.temperature,
    old_logp_source=old_logp_source(c)[0],
    loss=loss_config(c),
  )


def old_logp_source(c) -> tuple[str, str]:
  """("sampler" | "recompute", why): where the update's old log-probs come from (static: it
  decides the jitted program, rl/update.py "Old log-probs from the sampler").

  optim.old_logp_source="sampler" takes effect only where the sampler's per-token log-probs are, up
  to fp reassociation, what the update's old-view forward pass would compute (measured and
  tolerated: rl/update.SAMPLER_LOGP_TOL): fp32 sampling and update (model.compute_dtype ==
  rollout.cache_dtype == float32; bf16 has not been measured), temperature > 0 without top-k /
  top-p (the sampler's log-probs are under the filtered distribution), and no active method
  whose trained tokens were sampled otherwise (Plugin.sampler_logprobs False: SGE's per-token
  temperatures, HeRL's guided samples at herl.temperature, SPA). Otherwise "recompute". Per
  iteration the trainer further requires that the old view is the sampled one
  (old_logp_from_sampler)."""
  if c.optim.old_logp_source != "sampler":  # recompute (any other value: UpdateConfig refuses it)
    return c.optim.old_logp_source, f"optim.old_logp_source={c.optim.old_logp_source}"
  r, m = c.rollout, c.model
  if not (m.compute_dtype == r.cache_dtype == "float32"):
    why = f"compute_dtype={m.compute_dtype} cache_dtype={r.cache_dtype} (measured in float32 only)"
  elif r.temperature <= 0 or r.top_p < 1 or r.top_k > 0:
    why = f"temperature={r.temperature} top_p={r.top_p} top_k={r.top_k}"
  elif blockers := methods.sampler_logprobs_blockers(c):
    why = f"{', '.join(blockers)} train tokens sampled at other temperatures or prompts"
  else:
    return "sampler", "on-policy iterations take the sampler's log-probs"
  return "recompute", why


def old_logp_from_sampler(mode: str, ratio_variant: str, batch: dict) -> bool:
  """Whether this iteration's batch may use its sampler_logp as old log-probs (the update built
  with old_logp_source="sampler"): the old view of every turn is the prompt the sampler saw (modes
  'on', 'on_tips'; 'off' only with ratio_variant 'release', whose old view keeps the tips; the
  paper's off-policy old view is tip-free, a prompt never sampled) and the batch has none of the
  update's optional inputs (rl/update.OPTIONAL_KEYS: tokens sampled at another temperature, or
  under another policy)."""
  if batch_lib.views_for(mode, ratio_variant)[1] != "tips":
    return False
  return not any(k in batch for k in update_lib.OPTIONAL_KEYS)


def advantage_settings(c) -> adv_lib.AdvantageSettings:
  """The `advantage` section's choices and rollout.group_size (rl/advantages.AdvantageSettings
  checks them)."""
  return adv_lib.AdvantageSettings(
    estimator=c.advantage.estimator,
    episode_stats=c.advantage.episode_stats,
    group_size=c.rollout.group_size,
  )


def batch_config(c, pad_id: int) -> batch_lib.BatchConfig:
  """The batch builder's `optim` keys (layout, update_shapes, prompt_len_check, micro_rows, ...);
  rl/minibatch.arrange then lays out the update's rows."""
  # SGE's strategy phase and SPA's world-model text lengthen the response
  # (methods.response_tokens); prompts then get what is left of the context.
  response = methods.response_tokens(c)
  return by_name(
    batch_lib.BatchConfig,
    c.optim,  # layout, update_shapes, prompt_len_check, micro_rows
    max_prompt_len=min(c.optim.max_prompt_len, c.rollout.max_context - response),
    response_len=response,
    ratio_variant=c.empo2.ratio_variant,
    pad_id=pad_id,
  )


def actor_settings(c) -> ActorSettings:
  return ActorSettings(
    max_new_tokens=methods.response_tokens(c),
    max_context=c.rollout.max_context,
    top_p=c.rollout.top_p,
    top_k=c.rollout.top_k,
    tip_max_new_tokens=c.empo2.tip_max_new_tokens,
    tip_temperature=c.empo2.tip_temperature,
    intrinsic_scale=c.empo2.intrinsic_scale,
    # EMPO2's 1/(n+1) in the actor; RND's reward comes after the rollout (methods/rnd.py).
    intrinsic_reward=intrinsic_kind(c) == "count",
    memory_key=c.empo2.memory_key,
    memory_key_text=c.empo2.memory_key_text,
    tip_chat=c.empo2.tip_chat,
    cache_dtype=c.rollout.cache_dtype,
    reflector=c.empo2.reflector,
    records=methods.episode_records(c),
    memory_frozen=c.memory.frozen,
  )


def max_update_shape(c, batch_cfg: batch_lib.BatchConfig, update_cfg) -> dict:
  """optim.update_shapes="max": the update shape (iteration.UPDATE_FLOOR_KEYS) of the largest
  iteration the config allows, the floor of every update from the first, so that a run compiles
  its update once per layout and never later. Rows: whole chats of at most rollout.max_context
  tokens (packed) or prompts of at most optim.max_prompt_len (turn); turns per row: env.max_steps;
  slots: the mini-batches of variations_per_iter x group_size episodes of max_steps turns; slot
  rows: every episode of the iteration in one mini-batch, at most minibatch_size. A batch past one
  of these (a truncated chat split into several rows) grows the floor as "grow" does."""
  packed = c.optim.layout == "packed"
  growth = batch_cfg.bucket_growth
  episodes = c.rollout.variations_per_iter * c.rollout.group_size
  if packed:  # a packed row is one episode's chat
    length = batch_lib.bucket_size(c.rollout.max_context, batch_cfg.prompt_multiple, growth)
  else:  # build_batch: the prompt bucket, capped at max_prompt_len, then the response block
    prompt = batch_cfg.max_prompt_len
    length = min(batch_lib.bucket_size(prompt, batch_cfg.prompt_multiple, growth), prompt)
    length += batch_cfg.response_len
  _, slots = minibatch_lib.plan(episodes * c.env.max_steps, update_cfg.minibatch_size)
  rows = min(episodes, update_cfg.minibatch_size)
  return dict(
    len=length,
    turns=batch_lib.bucket_size(c.env.max_steps, 1, growth) if packed else 0,
    slots=slots,
    slot_rows=(
      batch_lib.bucket_size(rows, update_cfg.micro_rows, minibatch_lib.PACKED_SLOT_GROWTH)
      if packed
      else 0
    ),
  )
