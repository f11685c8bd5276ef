"""The EMPO2 update as one jitted function: old log-probs, low-prob mask, PPO mini-batches.

    batch = rl.minibatch.arrange(batch, cfg, seed=(config.seed, iteration))  # shuffled layout
    state, metrics = update_fn(state, batch)            # batch from rl/batch.build_batch
    state, metrics = update_fn(state, batch, ref_params)  # with LossConfig.kl_coef > 0

Inside one call:
  1. old log-probs of the "old" view for every row, in micro-batches, without gradient
     (docs/method.md §4: the trainer recomputes them, so the ratio starts at 1 when both views
     agree), or, with UpdateConfig.old_logp_source="sampler" and old_from_sampler true, the batch's
     `sampler_logp` taken as they are (no forward pass; see "Old log-probs from the sampler" below);
  2. the low-probability sample mask from those old log-probs (docs/method.md §5);
  3. for each PPO epoch and each mini-batch holding samples: gradients summed over its
     micro-batches (loss denominators are that mini-batch's own token / sequence counts, so
     accumulation equals one large batch), then one optax step (global-norm clipping + AdamW).
     After the first step the policy has moved, so the ratio of later mini-batches leaves 1 and
     clipping acts (docs/method.md §1 item 5: verl's mini-batches of 128 turn samples, 1 epoch).
Each of these is a pure function in rl/update_steps.py (its docstring shows how they compose; one
mini-batch's loss, gradient and optimizer step are in rl/update_grads.py);
make_update_fn binds the settings and jits their composition, update_steps.update.

Row layout. The B rows are S mini-batch slots of M = min(cfg.minibatch_rows, B) rows each, M a
multiple of micro_rows. Rows are assigned to micro-batches with a stride: row b goes to chunk
b % (B // micro_rows), and slot k is chunks [k * M/micro_rows, (k+1) * M/micro_rows). With the
batch sharded over its row axis, every micro-batch is then spread evenly over all devices and the
reshape is local. rl/minibatch.arrange builds this layout from build_batch's rows (shuffled).

Shapes stay static, counts are dynamic: a slot without real samples (sample_index < 0 on all its
rows) takes no optimizer step, and a chunk without response tokens is neither forwarded nor
differentiated (loops run over the non-empty ones only, in a while loop of dynamic trip count).
So padding rows cost no compute, and the jitted update compiles once per (B, L) shape.

Old log-probs from the sampler. The sampler returns each sampled token's log-prob under the
weights the update starts from; where the old view is exactly the token sequence the sampler saw
(modes 'on' and 'on_tips', and 'off' with ratio_variant 'release'), at the update's temperature,
without top-k/top-p, in the same dtype, those ARE the old log-probs up to floating-point
reassociation (sampler: chunked prefill + per-token decode against a KV cache; update: one forward
over the packed row). On SmolLM2-135M-Instruct in fp32 at temperature 1 the two differ by at most
3.1e-5 nats over 500 sampled response tokens (tests/rl/test_old_logprobs.py; SAMPLER_LOGP_TOL =
1e-3 is the tolerance). With cfg.old_logp_source="sampler" the update takes a dynamic flag
`old_from_sampler` (bool scalar; None = True): true skips the old-view forward pass (one of the
~5 forward-equivalents a trained token costs), false recomputes as above; one compiled program
serves both (lax.cond), so an off-policy iteration costs no extra compile. Which iterations may
pass true is the trainer's decision (train/settings.old_logp_from_sampler,
train/trainer.py). The low-probability mask then reads the sampler's log-probs (a token within
1e-3 of the delta threshold may flip; none in the measured batches).

Precision: params are fp32 master weights (and so are the AdamW moments and the gradients); the
model casts each weight to `compute_dtype` where it is used, so with compute_dtype=bfloat16 the
matmuls run in bf16 from the fp32 masters inside the jitted step. bf16 storage is refused:
one lr-1e-6 step is ~1% of a bf16 ulp at |w| = 0.02 and rounds away.

LoRA (model/lora.py; a params tree with adapters): the gradient, the optimizer state and the step
cover the fp32 adapters only (lora.trainable); the base, which may be stored in bf16, rides
through the state unchanged (donated and aliased, never copied).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from empo2_jax.model import lora
from empo2_jax.parallel.sharding import on_mesh
from empo2_jax.rl import update_steps
from empo2_jax.rl.logprobs import response_logprobs
from empo2_jax.rl.losses import LossConfig
from empo2_jax.rl.update_grads import UpdateSetup

# OPTIONAL_KEYS, as_packed and per_sample_stats are rl.update's names as well (re-exported).
from empo2_jax.rl.update_steps import (  # noqa: F401
  OPTIONAL_KEYS,
  as_packed,
  from_chunks,
  per_sample_stats,
  to_chunks,
)

MASTER_DTYPE = "float32"
OLD_LOGP_SOURCES = ("recompute", "sampler")
# The largest |sampler_logp - recomputed old_logp| (nats, over real response tokens) accepted
# when the update takes the sampler's log-probs as old log-probs: measured 3.1e-5 on
# SmolLM2-135M-Instruct in fp32 at temperature 1 (tests/rl/test_old_logprobs.py), ~30x margin.
SAMPLER_LOGP_TOL = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateConfig:
  """The update's settings under the config's own names (empo2_jax/defaults.py; built by name in
  train/settings.update_config): the `optim` keys it reads, rollout.temperature and the `loss`
  section. Only the settings the config does not hold have defaults."""

  lr: float
  weight_decay: float
  b1: float  # AdamW beta1
  b2: float  # AdamW beta2
  grad_clip: float  # global-norm gradient clip
  minibatch_size: int  # turn samples per optimizer step (verl: 16 variations x 8 rollouts)
  micro_rows: int  # rows per forward/backward (gradient accumulation unit)
  epochs: int  # PPO epochs over the batch
  temperature: float  # rollout.temperature: the sampler's training temperature
  # "recompute": old log-probs by a no-grad forward pass of the old view; "sampler": the batch's
  # sampler_logp where the caller says they are valid (old_from_sampler; module docstring).
  old_logp_source: str
  loss: LossConfig
  eps: float = 1e-8  # AdamW epsilon
  vocab_chunk: int = 8192  # vocabulary columns per log-prob chunk (rl/logprobs.py)

  def __post_init__(self):
    # The only check of these optim keys (train/build.check_config builds this object).
    if self.old_logp_source not in OLD_LOGP_SOURCES:
      raise ValueError(
        f"optim.old_logp_source={self.old_logp_source!r}; valid: {', '.join(OLD_LOGP_SOURCES)}"
      )
    for name in ("minibatch_size", "micro_rows", "epochs", "vocab_chunk"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"optim.{name}={getattr(self, name)} must be >= 1")

  @property
  def minibatch_rows(self) -> int:
    """Rows of one mini-batch slot: minibatch_size rounded up to a multiple of micro_rows."""
    return -(-self.minibatch_size // self.micro_rows) * self.micro_rows


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: optimizer steps taken


def make_optimizer(cfg) -> optax.GradientTransformation:
  """Global-norm clipping + AdamW from cfg's grad_clip, lr, b1, b2, eps and weight_decay (the
  config's names; any settings object with them). The moments take the params' dtype: fp32 with
  fp32 masters."""
  return optax.chain(
    optax.clip_by_global_norm(cfg.grad_clip),
    optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
  )


def init_train_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  """The state of `params`; the optimizer's covers what the update trains (lora.trainable: the
  LoRA adapters where the tree has them, else every weight)."""
  return TrainState(params, optimizer.init(lora.trainable(params)[0]), jnp.zeros((), jnp.int32))


def check_master_dtype(model_config) -> None:
  """The update trains fp32 master weights; anything else cannot take an lr-1e-6 step. With LoRA
  the trained weights are the fp32 adapters, and the frozen base may be stored in any dtype."""
  if model_config.param_dtype != MASTER_DTYPE and not model_config.lora_rank:
    raise ValueError(
      f"model param_dtype={model_config.param_dtype!r}: the update keeps {MASTER_DTYPE} master "
      "weights (and AdamW moments). In bfloat16 storage an lr-1e-6 AdamW step is far below "
      "half an ulp of a typical weight and rounds back to the old value, so nothing would be "
      "learned. Use param_dtype='float32' with compute_dtype='bfloat16' (bf16 matmuls from "
      "fp32 masters)."
    )


def _fuse_layer_grads(model_config, fuse_layer_grads: Optional[bool]) -> bool:
  """Whether the micro-batches' backward adds the layers' gradient into the accumulator in place
  (model/grad_accum.py): fuse_layer_grads, or where it is None wherever the model allows it
  (scanned layers with full remat). Raises ValueError when asked for where it is not allowed."""
  fusable = getattr(model_config, "scan_layers", False) and model_config.remat == "full"
  lora_rank = getattr(model_config, "lora_rank", 0)
  if fuse_layer_grads and (lora_rank or not fusable):
    raise ValueError(
      "fuse_layer_grads needs full fine-tuning (lora_rank=0: LoRA's adapter gradients are small) "
      "with scanned layers and full remat; got "
      f"lora_rank={lora_rank}, scan_layers={getattr(model_config, 'scan_layers', None)}, "
      f"remat={model_config.remat!r}"
    )
  fusable = fusable and not lora_rank
  return fusable if fuse_layer_grads is None else fuse_layer_grads


def make_update_fn(
  model_config,
  cfg: UpdateConfig,
  optimizer=None,
  *,
  batch_sharding=None,
  state_sharding=None,
  donate: bool = True,
  fuse_layer_grads: Optional[bool] = None,
):
  """Returns jitted update(state, batch[, ref_params]) -> (state, metrics).

  fuse_layer_grads (default: wherever the model allows it, i.e. scanned layers with full remat):
  the micro-batches' backward adds the layers' gradient into the accumulator layer by layer
  (model/grad_accum.py) instead of materialising each micro-batch's whole gradient and adding it:
  the same sums, without a second params-sized buffer for the layers.

  Params and batch may be placed with any sharding (jit follows them); `state_sharding` (a
  TrainState-shaped tree of shardings) pins the output state to the same layout (needed for the
  donated buffers to be reused when compiling ahead of time). `batch_sharding` (e.g.
  parallel.sharding.batch_sharding(mesh)) constrains every micro-batch along its row axis.

  metrics: the per-step loss metrics (loss, pg_loss, clipfrac_*, ratio_mean, approx_kl, entropy,
  grad_norm, update_norm = ||the step's parameter change|| (global norm), ...) averaged over the
  optimizer steps taken (ratio_max: their max); optim_steps; masked_frac,
  old_logp_mean, n_tokens over the whole batch; per_sample, a dict of [B, T] arrays (B, T = 1
  for a one-row-per-turn batch) from per_sample_stats (the only non-scalar entry);
  old_from_sampler (1.0: the old log-probs were the sampler's); sampler_vs_old_logp_absdiff /
  _maxdiff, the mean / max over real response tokens of |sampler_logp - recomputed old_logp|:
  over the whole batch when the old log-probs were recomputed, over the first mini-batch when
  they came from the sampler (its first forward pass
  runs on the unchanged weights, so its log-probs are the recomputed old ones, for free).
  """
  check_master_dtype(model_config)
  optimizer = optimizer or make_optimizer(cfg)
  fuse = _fuse_layer_grads(model_config, fuse_layer_grads)
  update = update_steps.update
  if batch_sharding is not None:  # the model pins its activations' rows on this mesh
    update = on_mesh(update, batch_sharding.mesh)
  # The settings bound; jit still names the program after update_steps.update (jit_update).
  setup = UpdateSetup(model_config, cfg, optimizer, fuse, batch_sharding)
  update = functools.partial(update, setup=setup)
  jit_kw: dict[str, Any] = {"donate_argnums": (0,) if donate else ()}
  if state_sharding is not None:  # inputs keep the shardings they were placed with
    jit_kw["out_shardings"] = (state_sharding, None)
  return jax.jit(update, **jit_kw)


def sample_logprobs_fn(model_config, cfg: UpdateConfig):
  """Jitted (params, tokens [B, L], attn [B, L], R) -> log-probs [B, R] of the last R columns
  (rl/batch.build_batch rows: the response right-aligned), in micro-batches of cfg.micro_rows rows
  (B a multiple of it), at cfg.temperature: the reference the tests hold the update's old
  log-probs and the sampler's against."""
  rows = cfg.micro_rows

  def f(params, tokens, attn, resp_len):
    n_chunks = tokens.shape[0] // rows
    out = jax.lax.map(
      lambda ta: response_logprobs(
        params,
        model_config,
        ta[0],
        ta[1],
        resp_len,
        temperature=cfg.temperature,
        chunk_size=cfg.vocab_chunk,
      ),
      (to_chunks(tokens, n_chunks), to_chunks(attn, n_chunks)),
    )
    return from_chunks(out)

  return jax.jit(f, static_argnums=(3,))
