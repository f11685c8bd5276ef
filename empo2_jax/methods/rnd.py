"""Random network distillation (Burda et al. 2018) as EMPO2's intrinsic reward ("empo2 + rnd").

The EMPO2 paper ablates its memory reward r_int = 1/(n+1) against RND; what its RND baseline fed
the networks is not in the released code (docs/methods.md §8.2). This module is the proposal of
docs/methods.md §8.5, every choice marked there as proposed:

  state text s_t  = the turn's current observation (Turn.obs_key: what EMPO2's memory keys and
                    GiGPO's anchor states are built from)
  x_t             = the frozen MiniLM sentence embedding of s_t (model/encoder.py, 384-d, mean
                    pooled, L2-normalised): the encoder EMPO2's memory uses, so the ablation
                    changes only the reward function
  x~_t            = clip((x_t - mu) / sigma, -5, 5), running per-dimension mean/variance updated
                    with the batch BEFORE it is normalised (the first batch is its own warm-up)
  f, f^           = MLPs 384 -> 256 -> 256 -> 128 with ReLU, orthogonal init with gain sqrt(2)
                    (RND's); the target f is frozen at init, the predictor f^ is trained with Adam
                    (lr 1e-4), one gradient step per rollout batch over all visited states
  r_raw,t         = mean_j (f^(x~_t)_j - f(x~_t)_j)^2, measured before the predictor's step
  r_int,t         = normalise(r_raw): "minmax" (default, proposed for GRPO: the batch scaled to
                    [0, 1], the range of EMPO2's 1/(n+1)), "std" (RND's: divided by the running
                    std of the discounted intrinsic return, gamma_int 0.99, per episode, no mean
                    subtraction) or "none"
  reward          = scale * r_int added where EMPO2 adds 1/(n+1) (Turn.intrinsic)

Everything the reward depends on (both networks, Adam state, the two running statistics) is one
pytree, `RNDState`, which the trainer checkpoints, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from empo2_jax.config_keys import by_name
from empo2_jax.methods.base import Plugin, register
from empo2_jax.methods.empo2 import intrinsic_kind

# The `rnd` config section's defaults (the base config's; the settings dataclass's below).
# [proposed]: a proposal of docs/methods.md, not a value found in the authors' code.
SECTION = dict(
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


NORMALISERS = ("minmax", "std", "none")
_EPS = 1e-8


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNDConfig:
  """The `rnd` section (SECTION, its defaults) by name, with empo2.intrinsic_scale and
  the run's seed (RNDPlugin.settings)."""

  scale: float  # beta: reward = scale * normalised error (empo2.intrinsic_scale)
  seed: int  # the run's seed
  input_dim: int = 384  # the MiniLM embedding width
  hidden: int = SECTION["hidden"]
  out: int = SECTION["out"]
  lr: float = SECTION["lr"]
  obs_clip: float = SECTION["obs_clip"]
  normalise: str = SECTION["normalise"]
  gamma: float = SECTION["gamma"]  # discount of the intrinsic return ("std")
  row_bucket: int = 64  # batches are padded to a multiple of this (few jitted shapes)

  def __post_init__(self):
    if self.normalise not in NORMALISERS:
      raise ValueError(f"rnd.normalise={self.normalise!r}; valid: {', '.join(NORMALISERS)}")
    if self.lr <= 0 or self.obs_clip <= 0 or not 0.0 <= self.gamma <= 1.0:
      raise ValueError(
        f"rnd: need lr > 0, obs_clip > 0 and 0 <= gamma <= 1; got lr={self.lr}, "
        f"obs_clip={self.obs_clip}, gamma={self.gamma}"
      )


class MLP(nn.Module):
  """ReLU MLP with RND's orthogonal(sqrt 2) init and zero biases."""

  features: Sequence[int]

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.orthogonal(np.sqrt(2.0))
    for i, f in enumerate(self.features):
      x = nn.Dense(f, kernel_init=init, bias_init=nn.initializers.zeros)(x)
      if i + 1 < len(self.features):
        x = nn.relu(x)
    return x


class RunningStats(NamedTuple):
  """Running mean / variance (population) of a stream of vectors, and how many were seen."""

  mean: Any  # [D] float32
  var: Any  # [D] float32
  count: Any  # [] float32


class RNDState(NamedTuple):
  target: Any  # frozen target MLP params
  predictor: Any  # trained predictor MLP params
  opt_state: Any  # Adam state of the predictor
  obs: RunningStats  # per-dimension statistics of the embeddings
  ret: RunningStats  # statistics of the discounted intrinsic return ("std"), D = 1
  updates: Any  # [] int32: predictor steps taken


def new_stats(dim: int) -> RunningStats:
  return RunningStats(np.zeros(dim, np.float32), np.ones(dim, np.float32), np.zeros((), np.float32))


def update_stats(stats: RunningStats, x) -> RunningStats:
  """Merge a batch x [N, D] into the statistics (Chan et al.'s parallel update, as RND's
  RunningMeanStd): the result equals the mean / population variance of everything seen."""
  x = np.asarray(x, np.float64)
  n = x.shape[0]
  if n == 0:
    return stats
  mean, var, count = (np.asarray(a, np.float64) for a in stats)
  b_mean, b_var = x.mean(0), x.var(0)
  total = count + n
  delta = b_mean - mean
  new_mean = mean + delta * n / total
  m2 = var * count + b_var * n + delta**2 * count * n / total
  return RunningStats(
    new_mean.astype(np.float32), (m2 / total).astype(np.float32), np.float32(total)
  )


def normalise_obs(stats: RunningStats, x, clip: float):
  """clip((x - mean) / sqrt(var), -clip, clip) (jnp or numpy in, jnp out)."""
  mean, var = jnp.asarray(stats.mean), jnp.asarray(stats.var)
  return jnp.clip((jnp.asarray(x) - mean) / jnp.sqrt(var + _EPS), -clip, clip)


def discounted_returns(rewards, episode_ids, steps, gamma: float) -> np.ndarray:
  """RND's RewardForwardFilter per episode: R_t = gamma * R_{t-1} + r_t in step order, starting
  from 0 at each episode's first step. [N] float64, in the input order."""
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros(len(rewards))
  order = sorted(range(len(rewards)), key=lambda i: (str(episode_ids[i]), steps[i]))
  running, prev = 0.0, object()
  for i in order:
    if episode_ids[i] != prev:
      running, prev = 0.0, episode_ids[i]
    running = gamma * running + rewards[i]
    out[i] = running
  return out


def minmax(r) -> np.ndarray:
  """The batch scaled to [0, 1]; a batch whose values are all equal gets 0 everywhere."""
  r = np.asarray(r, np.float64)
  if r.size == 0:
    return r.astype(np.float32)
  lo, hi = r.min(), r.max()
  if hi - lo <= 1e-12:
    return np.zeros_like(r, np.float32)
  return ((r - lo) / (hi - lo)).astype(np.float32)


def normalise_rewards(
  state: RNDState, raw, episode_ids, steps, cfg: RNDConfig
) -> tuple[np.ndarray, RNDState]:
  """(normalised intrinsic rewards [N] float32, state with updated return statistics)."""
  raw = np.asarray(raw, np.float64)
  if cfg.normalise == "none":
    return raw.astype(np.float32), state
  if cfg.normalise == "minmax":
    return minmax(raw), state
  ret = discounted_returns(raw, episode_ids, steps, cfg.gamma)
  stats = update_stats(state.ret, ret[:, None])
  return (raw / np.sqrt(float(stats.var[0]) + _EPS)).astype(np.float32), state._replace(ret=stats)


def networks(cfg: RNDConfig) -> tuple[MLP, MLP]:
  """(target, predictor). RND gives the predictor more capacity than the target; the proposal
  keeps both at 384 -> 256 -> 256 -> 128."""
  feats = (cfg.hidden, cfg.hidden, cfg.out)
  return MLP(feats), MLP(feats)


def make_optimizer(cfg: RNDConfig) -> optax.GradientTransformation:
  return optax.adam(cfg.lr)


def init_state(cfg: RNDConfig) -> RNDState:
  target, predictor = networks(cfg)
  k_t, k_p = jax.random.split(jax.random.PRNGKey(cfg.seed))
  x = jnp.zeros((1, cfg.input_dim), jnp.float32)
  t_params = target.init(k_t, x)
  p_params = predictor.init(k_p, x)
  return RNDState(
    t_params,
    p_params,
    make_optimizer(cfg).init(p_params),
    new_stats(cfg.input_dim),
    new_stats(1),
    np.zeros((), np.int32),
  )


def prediction_errors(target_params, predictor_params, x_norm, cfg: RNDConfig):
  """mean_j (f^(x)_j - f(x)_j)^2 per row [N]."""
  target, predictor = networks(cfg)
  diff = predictor.apply(predictor_params, x_norm) - target.apply(target_params, x_norm)
  return jnp.mean(jnp.square(diff), axis=-1)


def make_step(cfg: RNDConfig):
  """jit(step)(state, x_norm [B, D], mask [B]) -> (state, raw errors [B] before the step, loss):
  the errors of every row, then one Adam step of the predictor on the masked rows' mean error."""
  optimizer = make_optimizer(cfg)

  def loss_fn(p, t, x, mask):
    err = prediction_errors(t, p, x, cfg)
    return jnp.sum(err * mask) / jnp.maximum(jnp.sum(mask), 1.0), err

  def step(state: RNDState, x, mask):
    (loss, err), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.predictor, state.target, x, mask
    )
    updates, opt_state = optimizer.update(grads, state.opt_state, state.predictor)
    predictor = optax.apply_updates(state.predictor, updates)
    return state._replace(predictor=predictor, opt_state=opt_state), err, loss

  return jax.jit(step)


class RND:
  """The stateful side: embeds state texts with the frozen encoder, rewards them, trains the
  predictor. `state` is the pytree the trainer checkpoints.

      rnd = RND(RNDConfig(...), encoder)
      rewards, stats = rnd.rewards(texts, episode_ids, steps)   # [N], already times cfg.scale
  """

  def __init__(self, cfg: RNDConfig, encoder):
    if encoder is not None and encoder.dim != cfg.input_dim:
      cfg = dataclasses.replace(cfg, input_dim=encoder.dim)
    self.cfg, self.encoder = cfg, encoder
    self.state = init_state(cfg)
    self._step = make_step(cfg)

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    return self.encoder.encode(list(texts))

  def rewards_from_embeddings(self, x, episode_ids, steps) -> tuple[np.ndarray, dict]:
    """(rewards [N] float32, stats) for embeddings x [N, D]; updates the statistics and takes one
    predictor step. stats: rnd/error_mean, rnd/error_max, rnd/predictor_loss, rnd/reward_mean
    ({} when N = 0)."""
    x = np.asarray(x, np.float32)
    n = x.shape[0]
    if n == 0:
      return np.zeros(0, np.float32), {}
    state = self.state._replace(obs=update_stats(self.state.obs, x))  # update before use
    rows = -(-n // self.cfg.row_bucket) * self.cfg.row_bucket
    xp = np.zeros((rows, x.shape[1]), np.float32)
    xp[:n] = x
    mask = (np.arange(rows) < n).astype(np.float32)
    x_norm = normalise_obs(state.obs, xp, self.cfg.obs_clip)
    state, err, loss = self._step(state, x_norm, jnp.asarray(mask))
    raw = np.asarray(err, np.float64)[:n]
    r, state = normalise_rewards(state, raw, episode_ids, steps, self.cfg)
    self.state = state._replace(updates=np.asarray(state.updates + 1, np.int32))
    stats = {
      "rnd/error_mean": float(raw.mean()),
      "rnd/error_max": float(raw.max()),
      "rnd/predictor_loss": float(loss),
      "rnd/reward_mean": float(self.cfg.scale * r.mean()),
    }
    return (self.cfg.scale * r).astype(np.float32), stats

  def rewards(self, texts: Sequence[str], episode_ids, steps) -> tuple[np.ndarray, dict]:
    """rewards_from_embeddings of the texts' embeddings."""
    return self.rewards_from_embeddings(self.embed(texts), episode_ids, steps)


# -- the plugin: what RND adds to the trainer --
ROLLOUTS = ("memory", "all")


class RNDPlugin(Plugin):
  """After the rollout: every turn's current observation -> RND reward in Turn.intrinsic (on the
  rollouts rnd.rollouts names); the networks are checkpointed. On with
  empo2.intrinsic_reward='rnd'."""

  name, section = "rnd", SECTION

  @classmethod
  def settings(cls, c, **given) -> RNDConfig:
    """The `rnd` section by name, the reward scale empo2.intrinsic_scale and the run's seed;
    `given`: the rest (input_dim: the encoder's width)."""
    return by_name(RNDConfig, c.rnd, scale=c.empo2.intrinsic_scale, seed=c.seed, **given)

  @classmethod
  def check(cls, c) -> None:
    if c.rnd.rollouts not in ROLLOUTS:
      raise ValueError(f"rnd.rollouts={c.rnd.rollouts!r}; valid: {', '.join(ROLLOUTS)}")
    cls.settings(c)

  @classmethod
  def active(cls, c) -> bool:
    return intrinsic_kind(c) == "rnd"

  def __init__(self, c, **kw):
    super().__init__(c, **kw)
    self.rnd = RND(self.settings(c), self.encoder)

  def after_rollout(self, ctx, episodes, iteration, mode, key):
    turns = [t for e in episodes if not e.env_failed for t in e.turns]
    r, stats = self.rnd.rewards(
      [t.obs_key or " " for t in turns], [t.rollout_id for t in turns], [t.step for t in turns]
    )
    give = self.c.rnd.rollouts == "all" or mode != "on"
    for t, x in zip(turns, r):
      t.intrinsic = float(x) if give else 0.0
    return episodes, dict(stats, **{"rnd/rewarded": int(give and len(turns) > 0)})

  def state_tree(self):
    return self.rnd.state._asdict()

  def load(self, tree, meta: dict) -> None:
    if tree is None:
      return
    d = dict(tree)
    for k in ("obs", "ret"):
      d[k] = RunningStats(**dict(d[k])) if isinstance(d[k], dict) else d[k]
    self.rnd.state = RNDState(**d)


register(
  "empo2_rnd",
  "EMPO2 with an RND reward on MiniLM state embeddings in place of 1/(n+1) (methods/rnd.py)",
  overrides={"empo2.intrinsic_reward": "rnd"},
  label="EMPO2+RND",
  plugin=RNDPlugin,
)


__all__ = [
  "RNDPlugin",
  "SECTION",
  "ROLLOUTS",
  "RNDConfig",
  "RNDState",
  "RunningStats",
  "RND",
  "MLP",
  "NORMALISERS",
  "init_state",
  "make_step",
  "update_stats",
  "normalise_obs",
  "normalise_rewards",
  "discounted_returns",
  "minmax",
  "prediction_errors",
]
