"""Retrospex's offline critic (docs/methods.md §3.2 item 4): text encoders in Flax and IQL with
optax.

Networks (DRRN style): token ids -> Embed(vocab, 64) shared by the network's fields -> one GRU
(hidden 128) per text field, last hidden state -> concat -> Dense(128) -> ReLU -> Dense(1).
  V(s)    = V(task, obs)                       2 GRUs
  Q(s, a) = Q(task, obs, act)                  3 GRUs; twin_q: two Q networks, Q = min(Q1, Q2)
IQL, per batch (no policy extraction):
  target_q = Q_target(s, a)                                     (no gradient; min over twins)
  u        = target_q - V(s);    L_V = mean(|tau - 1[u < 0]| * u^2)          expectile tau
  L_Q      = mean over the Q networks of mean((Q_i(s, a) - (r + gamma (1 - done) V(s')))^2)
                                                                (V(s') without gradient)
  Adam on V and on Q (separately), then Q_target <- (1 - alpha) Q_target + alpha Q   (Polyak)
Defaults: tau 0.7, gamma 0.99, alpha 0.005, lr 1e-4, batch 128 (Retrospex's code).
The critic's advantage at act time is Q_target(s, a) - V(s) (Retrospex's get_q).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable, Optional

import numpy as np
from etils import epath

import jax
import jax.numpy as jnp
import flax.linen as nn
import optax


@dataclasses.dataclass(frozen=True)
class IQLConfig:
  embed: int = 64
  hidden: int = 128
  twin_q: bool = False  # Retrospex: twin Q on WebShop, one Q on ScienceWorld
  expectile: float = 0.7
  gamma: float = 0.99
  polyak: float = 0.005
  lr: float = 1e-4
  batch_size: int = 128
  steps: int = 20000  # at most this many updates ...
  max_passes: int = 20  # ... and at most this many passes over the data
  seed: int = 0

  def __post_init__(self):
    if not 0.0 < self.expectile < 1.0:
      raise ValueError(f"expectile={self.expectile} must be in (0, 1)")
    if not 0.0 <= self.polyak <= 1.0 or not 0.0 <= self.gamma <= 1.0:
      raise ValueError(f"polyak={self.polyak} and gamma={self.gamma} must be in [0, 1]")


class TextCritic(nn.Module):
  """One scalar per example from `len(fields)` text fields (see the module docstring)."""

  vocab_size: int
  n_fields: int
  embed: int = 64
  hidden: int = 128

  @nn.compact
  def __call__(self, fields):  # fields: [(ids [B, L_f] int32, lengths [B] int32)] * n_fields
    if len(fields) != self.n_fields:
      raise ValueError(f"TextCritic with {self.n_fields} fields got {len(fields)}")
    emb = nn.Embed(self.vocab_size, self.embed, name="embed")
    hs = []
    for i, (ids, lengths) in enumerate(fields):
      rnn = nn.RNN(nn.GRUCell(features=self.hidden, name=f"gru{i}"), return_carry=True)
      h, _ = rnn(emb(ids), seq_lengths=lengths)
      hs.append(h)
    h = nn.relu(nn.Dense(self.hidden, name="fc1")(jnp.concatenate(hs, axis=-1)))
    return nn.Dense(1, name="fc2")(h)[..., 0]


def state_fields(b: dict, obs: str = "obs"):
  return [(b["task_ids"], b["task_len"]), (b[f"{obs}_ids"], b[f"{obs}_len"])]


def action_fields(b: dict):
  return state_fields(b) + [(b["act_ids"], b["act_len"])]


@dataclasses.dataclass(frozen=True)
class Nets:
  q: TextCritic
  v: TextCritic
  n_q: int  # 1 or 2 (twin)

  def q_values(self, q_params, fields):
    """[n_q, B]"""
    return jnp.stack([self.q.apply(p, fields) for p in q_params])

  def q_min(self, q_params, fields):
    return jnp.min(self.q_values(q_params, fields), axis=0)

  def v_value(self, v_params, fields):
    return self.v.apply(v_params, fields)


def make_nets(vocab_size: int, cfg: IQLConfig) -> Nets:
  q = TextCritic(vocab_size, 3, cfg.embed, cfg.hidden)
  v = TextCritic(vocab_size, 2, cfg.embed, cfg.hidden)
  return Nets(q, v, 2 if cfg.twin_q else 1)


def expectile_loss(u, tau):
  """mean(|tau - 1[u < 0]| * u^2)."""
  weight = jnp.abs(tau - (u < 0).astype(u.dtype))
  return jnp.mean(weight * u**2)


def iql_losses(nets: Nets, q_params, v_params, q_target, batch: dict, cfg: IQLConfig):
  """(L_Q, L_V, info) of one batch at the given parameters."""
  sa = action_fields(batch)
  target_q = jax.lax.stop_gradient(nets.q_min(q_target, sa))
  next_v = jax.lax.stop_gradient(nets.v_value(v_params, state_fields(batch, "next_obs")))
  v = nets.v_value(v_params, state_fields(batch))
  v_loss = expectile_loss(target_q - v, cfg.expectile)
  targets = batch["reward"] + cfg.gamma * (1.0 - batch["done"]) * next_v
  qs = nets.q_values(q_params, sa)
  q_loss = jnp.mean(jnp.mean((qs - targets[None]) ** 2, axis=1))
  return q_loss, v_loss, {"q_mean": jnp.mean(qs), "v_mean": jnp.mean(v)}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class IQLState:
  q_params: Any  # tuple of n_q param trees
  q_target: Any
  v_params: Any
  q_opt: Any
  v_opt: Any
  step: Any


def init_state(
  nets: Nets, cfg: IQLConfig, example: dict
) -> tuple[IQLState, optax.GradientTransformation]:
  keys = jax.random.split(jax.random.PRNGKey(cfg.seed), nets.n_q + 1)
  ex = {k: jnp.asarray(v[:1]) for k, v in example.items()}

  @jax.jit  # flax's lifted scan (the GRUs) is slow to initialise eagerly
  def init_params(keys, ex):
    q_params = tuple(nets.q.init(keys[i], action_fields(ex)) for i in range(nets.n_q))
    return q_params, nets.v.init(keys[-1], state_fields(ex))

  q_params, v_params = init_params(keys, ex)
  opt = optax.adam(cfg.lr)
  state = IQLState(
    q_params=q_params,
    q_target=jax.tree.map(jnp.copy, q_params),
    v_params=v_params,
    q_opt=opt.init(q_params),
    v_opt=opt.init(v_params),
    step=jnp.zeros((), jnp.int32),
  )
  return state, opt


def make_update(nets: Nets, cfg: IQLConfig, opt: optax.GradientTransformation) -> Callable:
  """jitted (state, batch) -> (state, metrics): one IQL step (module docstring)."""

  def update(state: IQLState, batch: dict):
    # L_Q reads V only through the stopped V(s') and L_V reads Q only through the stopped target,
    # so the gradient of L_Q + L_V splits into dL_Q/dQ and dL_V/dV: one forward and backward.
    def loss_fn(params):
      q_loss, v_loss, _ = iql_losses(nets, params[0], params[1], state.q_target, batch, cfg)
      return q_loss + v_loss, (q_loss, v_loss)

    (_, (q_loss, v_loss)), (q_grads, v_grads) = jax.value_and_grad(loss_fn, has_aux=True)(
      (state.q_params, state.v_params)
    )
    q_upd, q_opt = opt.update(q_grads, state.q_opt, state.q_params)
    v_upd, v_opt = opt.update(v_grads, state.v_opt, state.v_params)
    q_params = optax.apply_updates(state.q_params, q_upd)
    v_params = optax.apply_updates(state.v_params, v_upd)
    q_target = polyak(state.q_target, q_params, cfg.polyak)
    new = IQLState(q_params, q_target, v_params, q_opt, v_opt, state.step + 1)
    return new, {"q_loss": q_loss, "v_loss": v_loss}

  return jax.jit(update)


def polyak(target, online, alpha: float):
  return jax.tree.map(lambda t, o: (1.0 - alpha) * t + alpha * o, target, online)


def advantages(nets: Nets, state: IQLState, arrays: dict) -> np.ndarray:
  """Q_target(s, a) - V(s) per row of `arrays` (task/obs/act ids and lengths)."""
  keys = [f"{f}_{s}" for f in ("task", "obs", "act") for s in ("ids", "len")]
  out = _advantage_fn(nets)(state.q_target, state.v_params, {k: arrays[k] for k in keys})
  return np.asarray(out, np.float64)


@functools.lru_cache(maxsize=8)
def _advantage_fn(nets: Nets):
  def fn(q_target, v_params, a):
    return nets.q_min(q_target, action_fields(a)) - nets.v_value(v_params, state_fields(a))

  return jax.jit(fn)


def train(
  arrays: dict, vocab_size: int, cfg: IQLConfig, log: Optional[Callable[[int, dict], None]] = None
) -> tuple[Nets, IQLState, list[dict]]:
  """IQL on the transition arrays (retrospex_data.encode_transitions): min(steps, max_passes
  passes) updates of batch_size rows, reshuffled every pass (seeded). Returns (nets, state,
  per-pass mean losses)."""
  n = len(arrays["reward"])
  if n == 0:
    raise ValueError("no transitions to train the critic on")
  nets = make_nets(vocab_size, cfg)
  state, opt = init_state(nets, cfg, arrays)
  update = make_update(nets, cfg, opt)
  bs = min(cfg.batch_size, n)
  per_pass = n // bs
  total = min(cfg.steps, cfg.max_passes * per_pass)
  rng = np.random.default_rng(cfg.seed)
  history, step = [], 0
  while step < total:
    perm = rng.permutation(n)
    sums = {"q_loss": 0.0, "v_loss": 0.0}
    k = 0
    for j in range(per_pass):
      if step >= total:
        break
      idx = perm[j * bs : (j + 1) * bs]
      state, m = update(state, {key: v[idx] for key, v in arrays.items()})
      for key in sums:
        sums[key] += float(m[key])
      step, k = step + 1, k + 1
    rec = {
      "pass": len(history) + 1,
      "steps": step,
      **{key: v / max(k, 1) for key, v in sums.items()},
    }
    history.append(rec)
    if log is not None:
      log(step, rec)
  return nets, state, history


# ---------------------------------------------------------------------------------------------
CRITIC_DIR, TOKENIZER_FILE, META_FILE = "critic", "tokenizer.model", "critic.json"


def save(directory: str, state: IQLState, cfg: IQLConfig, tokenizer_proto: bytes, meta: dict):
  """<directory>/critic (orbax), tokenizer.model (SentencePiece) and critic.json (config, meta).
  `directory` may be gs:// (etils.epath; orbax writes it through tensorstore)."""
  import orbax.checkpoint as ocp

  from empo2_jax import remote

  remote.check(directory)
  root = epath.Path(remote.absolute(directory))
  root.mkdir(parents=True, exist_ok=True)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(root / CRITIC_DIR, jax.device_get(state), force=True)
  ckpt.wait_until_finished()
  (root / TOKENIZER_FILE).write_bytes(tokenizer_proto)
  (root / META_FILE).write_text(json.dumps({"iql": dataclasses.asdict(cfg), **meta}, indent=1))


def load(directory: str):
  """(nets, state, cfg, tokenizer proto, meta) saved by `save` (local or gs://)."""
  import orbax.checkpoint as ocp

  from empo2_jax import remote
  from empo2_jax.baselines.retrospex_data import Tokenizer

  remote.check(directory)
  root = epath.Path(remote.absolute(directory))
  if not (root / META_FILE).exists():
    raise FileNotFoundError(
      f"no Retrospex critic in {directory} ({META_FILE} missing); train one with "
      "launch/retrospex.py train"
    )
  meta = json.loads((root / META_FILE).read_text())
  cfg = IQLConfig(**meta.pop("iql"))
  tok = Tokenizer((root / TOKENIZER_FILE).read_bytes())
  nets = make_nets(tok.vocab_size, cfg)
  example = {
    f"{k}_{s}": np.ones((1, 1), np.int32) if s == "ids" else np.ones((1,), np.int32)
    for k in ("task", "obs", "act", "next_obs")
    for s in ("ids", "len")
  }
  example.update(reward=np.zeros(1, np.float32), done=np.zeros(1, np.float32))
  abstract, _ = init_state(nets, cfg, example)
  ckpt = ocp.StandardCheckpointer()
  state = ckpt.restore(root / CRITIC_DIR, abstract)
  return nets, state, cfg, tok, meta


__all__ = [
  "IQLConfig",
  "TextCritic",
  "Nets",
  "IQLState",
  "make_nets",
  "expectile_loss",
  "iql_losses",
  "init_state",
  "make_update",
  "polyak",
  "advantages",
  "train",
  "save",
  "load",
]
