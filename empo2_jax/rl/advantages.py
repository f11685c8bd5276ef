"""Advantages (docs/method.md §6), on the host with numpy: one value per turn sample.

Input format: flat arrays with one entry per turn (any order), all of length N:
  group_ids   a variation's group: all turns of its n rollouts share it (hashable values)
  rollout_ids episode id, unique across the batch (hashable values)
  steps       int, the turn's index within its rollout (orders the turns for discounting)
  obs_keys    hashable, the turn's current observation (GiGPO anchor states)
  returns     float, the episode return, repeated on each of its turns
  rewards     float, the turn's own reward (env score delta, plus intrinsic when wanted)
  intrinsic   float, the turn's intrinsic (memory) reward, 0 for non-memory rollouts

Groups of a single member (one turn, one rollout, one anchor state) get advantage 0: there is no
baseline to compare against. Groups whose scores are all equal get exactly 0 (never NaN).

Estimators by name (`advantage.estimator`): a registry of functions of the trainer's turns
(objects with group_id, rollout_id, step, obs_key, episode_return, reward, intrinsic, valid:
rl/batch.Turn), each with the `advantage.<key>` settings it reads:

    turn_advantages(turns, "gigpo", config.advantage)       # [N] float32
    @register_estimator("my_adv", settings=("gamma",), keys={"my_adv_temp": 1.0})
    def my_adv(turns, gamma=0.95, my_adv_temp=1.0): ...     # a new estimator: one function

`settings` names keys the base config has; `keys` adds the estimator's own to the `advantage`
section with their defaults (defaults.py), so `--config.advantage.my_adv_temp=2` works.

Every estimator adds the turns' memory reward r_int (docs/method.md §3) to the score it
normalises.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np


def _group_index(keys):
  """Dense int ids [N] for arbitrary hashable keys, in order of first appearance."""
  ids, out = {}, np.empty(len(keys), np.int64)
  for i, k in enumerate(keys):
    out[i] = ids.setdefault(k, len(ids))
  return out, len(ids)


def _normalise_in_groups(scores, gid, n_groups, *, use_std, ddof, eps):
  """(s - mean_g) / (std_g + eps) (or / 1 without std); groups of size 1 -> 0."""
  scores = np.asarray(scores, np.float64)
  count = np.bincount(gid, minlength=n_groups).astype(np.float64)
  mean = np.bincount(gid, weights=scores, minlength=n_groups) / np.maximum(count, 1)
  centred = scores - mean[gid]
  if use_std:
    sq = np.bincount(gid, weights=centred**2, minlength=n_groups)
    std = np.sqrt(sq / np.maximum(count - ddof, 1))
    centred = centred / (std[gid] + eps)
  return np.where(count[gid] > 1, centred, 0.0).astype(np.float32)


def grpo_step_advantages(group_ids, returns, intrinsic=None, *, ddof=1, eps=1e-6):
  """Paper-era GRPO, step level: score = episode return + turn's intrinsic reward, normalised over
  all turns of the group.

  Args:
    group_ids: [N] hashable group (one variation's rollouts) of each turn.
    returns: [N] float episode return, repeated on each of its turns.
    intrinsic: [N] float intrinsic reward of each turn, or None (0).
    ddof: delta degrees of freedom of the group std.
    eps: added to the std.
  Returns:
    [N] float32 advantages; 0 in single-member groups.
  """
  scores = np.asarray(returns, np.float64)
  if intrinsic is not None:
    scores = scores + np.asarray(intrinsic, np.float64)
  gid, n = _group_index(group_ids)
  return _normalise_in_groups(scores, gid, n, use_std=True, ddof=ddof, eps=eps)


def rollout_advantages(group_ids, rollout_ids, rewards, *, ddof=1, eps=1e-6):
  """Release GRPO, rollout level: score = sum of the rollout's turn rewards, normalised over the n
  rollouts of the group (ddof=1), broadcast back to every turn.

  Args:
    group_ids: [N] hashable group (one variation's rollouts) of each turn.
    rollout_ids: [N] hashable episode id of each turn, unique across the batch.
    rewards: [N] float reward of each turn.
    ddof: delta degrees of freedom of the group std.
    eps: added to the std.
  Returns:
    [N] float32 advantages, the rollout's on each of its turns; 0 in single-rollout groups.
  """
  rid, n_roll = _group_index(rollout_ids)
  score = np.bincount(rid, weights=np.asarray(rewards, np.float64), minlength=n_roll)
  roll_group = np.empty(n_roll, dtype=object)
  roll_group[rid] = list(group_ids)
  gid, n_groups = _group_index(list(roll_group))
  adv = _normalise_in_groups(score, gid, n_groups, use_std=True, ddof=ddof, eps=eps)
  return adv[rid]


def discounted_returns(rollout_ids, steps, rewards, gamma):
  """G_t = sum_{k>=t} gamma^(k-t) r_k within each rollout, in step order.

  Args:
    rollout_ids: [N] hashable episode id of each turn.
    steps: [N] int index of each turn within its rollout.
    rewards: [N] float reward of each turn.
    gamma: float discount.
  Returns:
    [N] float64 discounted returns, in the input order.
  """
  rewards = np.asarray(rewards, np.float64)
  rid_all = _group_index(rollout_ids)[0]
  order = np.lexsort((np.asarray(steps), rid_all))  # by rollout, then step
  rid = rid_all[order]
  out = np.zeros(len(rewards), np.float64)
  running, prev = 0.0, None
  for j in range(len(order) - 1, -1, -1):  # backwards through each rollout
    i = order[j]
    if rid[j] != prev:
      running, prev = 0.0, rid[j]
    running = rewards[i] + gamma * running
    out[i] = running
  return out


EPISODE_STATS = ("trajectory", "steps")


def _group_stats(values, gid, n_groups, ddof):
  """(mean [G], std [G], count [G]) of `values` per group id."""
  values = np.asarray(values, np.float64)
  count = np.bincount(gid, minlength=n_groups).astype(np.float64)
  mean = np.bincount(gid, weights=values, minlength=n_groups) / np.maximum(count, 1)
  sq = np.bincount(gid, weights=(values - mean[gid]) ** 2, minlength=n_groups)
  return mean, np.sqrt(sq / np.maximum(count - ddof, 1)), count


def gigpo_advantages(
  group_ids,
  rollout_ids,
  steps,
  obs_keys,
  returns,
  rewards,
  *,
  gamma=0.95,
  step_weight=1.0,
  use_std=True,
  episode_stats="trajectory",
  valid=None,
  invalid_penalty=0.0,
  ddof=1,
  eps=1e-6,
):
  """GiGPO (Feng et al. 2025): A = A_episode + w * A_step.

  Episode score of a turn = its episode return, minus `invalid_penalty` when the turn's action was
  invalid (`valid[i]` False); step return R_t = the turn's discounted return (gamma), minus the
  same penalty on invalid turns (verl-agent's apply_invalid_action_penalty, coefficient 0.1 there).
  A_episode = (score - mean) / F_norm with the group's statistics taken over the scores that
  `episode_stats` names.
  A_step = (R_t - mean) / F_norm within the turn's anchor group (turns of the same group
  whose current observation is identical; singletons -> 0).
  F_norm = std + eps with use_std=True ("mean_std_norm", the paper's "w/ std" entry), 1 with
  use_std=False ("mean_norm", verl-agent's default, "w/o std"). std has ddof=1 (torch.std).
  A group with a single member gets A_episode = 0 (verl-agent: mean 0, std 1, i.e. the raw score;
  with group_size >= 2 that happens only when the pool lost the other rollouts).
  The defaults (trajectory, no penalty) are this project's earlier GiGPO; the `gigpo` method
  (methods/) sets verl-agent's (steps, use_std False, penalty 0.1).

  Args:
    group_ids: [N] hashable group (one variation's rollouts) of each turn.
    rollout_ids: [N] hashable episode id of each turn, unique across the batch.
    steps: [N] int index of each turn within its rollout.
    obs_keys: [N] hashable current observation of each turn (the anchor states).
    returns: [N] float episode return, repeated on each of its turns.
    rewards: [N] float reward of each turn (discounted into R_t).
    gamma: discount of the step return.
    step_weight: w, the weight of A_step.
    use_std: divide by std + eps (True) or by 1 (False).
    episode_stats: "trajectory": one score per rollout of the group (the rollout's first turn);
      "steps": every turn of the group (verl-agent's default,
      compute_mean_std_cross_steps=True: longer episodes weigh more).
    valid: [N] bool, the turn's action was valid; None: all valid.
    invalid_penalty: float subtracted from both scores of an invalid turn.
    ddof: delta degrees of freedom of the std.
    eps: added to the std.
  Returns:
    [N] float32 advantages.
  """
  n = len(returns)
  penalty = np.zeros(n)
  if valid is not None and invalid_penalty:
    penalty = invalid_penalty * (1.0 - np.asarray(valid, np.float64))
  score = np.asarray(returns, np.float64) - penalty
  gid, n_groups = _group_index(group_ids)
  if episode_stats == "steps":
    mean, std, count = _group_stats(score, gid, n_groups, ddof)
  else:
    rid, n_roll = _group_index(rollout_ids)
    steps_arr = np.asarray(steps)
    first = np.full(n_roll, -1, np.int64)  # each rollout's first turn (lowest step)
    for i in np.lexsort((steps_arr, rid)):
      if first[rid[i]] < 0:
        first[rid[i]] = i
    mean, std, count = _group_stats(score[first], gid[first], n_groups, ddof)
  centred = score - mean[gid]
  if use_std:
    centred = centred / (std[gid] + eps)
  a_episode = np.where(count[gid] > 1, centred, 0.0)
  g = discounted_returns(rollout_ids, steps, rewards, gamma) - penalty
  aid, n_anchor = _group_index(list(zip(group_ids, obs_keys)))
  a_step = _normalise_in_groups(g, aid, n_anchor, use_std=use_std, ddof=ddof, eps=eps)
  return (a_episode + step_weight * a_step).astype(np.float32)


# ---------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class Estimator:
  name: str
  fn: Callable[..., np.ndarray]  # fn(turns, **settings) -> [N] float32
  settings: tuple[str, ...]  # the advantage.<key> settings fn takes, by the config's names
  keys: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # its own keys -> defaults


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
  name: str, settings: Sequence[str] = (), keys: Optional[Mapping[str, Any]] = None
):
  """Decorator: registers fn(turns, **settings) as advantage.estimator=`name`.

  Args:
    name: the estimator's name; must not be registered yet.
    settings: the advantage.<key> settings fn takes as keyword arguments, by the config's names
      (keys the base config has, such as gamma).
    keys: the estimator's own config keys -> defaults: defaults.py adds each to the `advantage`
      section (register before the config is built, e.g. from a file given to --import), and fn
      takes them as keyword arguments like `settings`. A key another estimator declared with
      another default is refused.
  Returns:
    A decorator that registers fn and returns it unchanged.
  """
  keys = dict(keys or {})
  for other in ESTIMATORS.values():
    clash = [k for k in keys if k in other.keys and other.keys[k] != keys[k]]
    if clash:
      raise ValueError(
        f"advantage estimator {name!r}: advantage.{clash[0]} is {other.name!r}'s key with "
        f"default {other.keys[clash[0]]!r}; name yours differently"
      )

  def deco(fn):
    if name in ESTIMATORS:
      raise ValueError(f"advantage estimator {name!r} is already registered")
    ESTIMATORS[name] = Estimator(name, fn, tuple(settings) + tuple(keys), keys)
    return fn

  return deco


def default_keys() -> dict:
  """Every registered estimator's own config keys and defaults (defaults.py adds them to
  `advantage`)."""
  out: dict = {}
  for est in ESTIMATORS.values():
    out.update(est.keys)
  return out


def get_estimator(name: str) -> Estimator:
  """The Estimator registered under `name` (ValueError naming the valid ones if none)."""
  if name not in ESTIMATORS:
    raise ValueError(f"advantage.estimator={name!r}; valid: {', '.join(ESTIMATORS)}")
  return ESTIMATORS[name]


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
  """The run's advantage choices, checked here once (train/settings.advantage_settings; the
  config check builds it): the estimator (registered: get_estimator), GiGPO's episode statistics
  and the group size the group-normalised advantages need."""

  estimator: str  # advantage.estimator
  episode_stats: str = "trajectory"  # advantage.episode_stats (EPISODE_STATS)
  group_size: int = 2  # rollout.group_size

  def __post_init__(self):
    get_estimator(self.estimator)
    if self.episode_stats not in EPISODE_STATS:
      raise ValueError(
        f"advantage.episode_stats={self.episode_stats!r}; valid: {', '.join(EPISODE_STATS)}"
      )
    if self.group_size < 2:
      raise ValueError(
        f"rollout.group_size={self.group_size}: must be >= 2 (group-normalised advantages; "
        "ctx_distill's edge gate splits each group in two halves)"
      )


def turn_advantages(turns: Sequence, estimator: str, settings=None, **kwargs) -> np.ndarray:
  """Advantages of the turns by the estimator `estimator`.

  Args:
    turns: N turns (rl/batch.Turn).
    estimator: a registered estimator's name.
    settings: a mapping such as config.advantage, from which the settings the estimator reads are
      taken; absent keys keep the function's defaults. None: none.
    **kwargs: explicit settings; they win over `settings`.
  Returns:
    [N] float32 advantages.
  """
  est = get_estimator(estimator)
  kw = {k: settings[k] for k in est.settings if settings is not None and k in settings}
  kw.update(kwargs)
  return est.fn(turns, **kw)


@register_estimator("grpo_step")
def grpo_step_turns(turns, ddof=1, eps=1e-6):
  """Paper-era GRPO, step level (docs/method.md §6): s = episode return + the turn's r_int.

  The GRPO group advantage A = (s - mean) / (std + eps) over the turns of the variation's group.

  Args:
    turns: N turns (group_id, episode_return, intrinsic).
    ddof: delta degrees of freedom of the group std.
    eps: added to the std.
  Returns:
    [N] float32 advantages.
  """
  return grpo_step_advantages(
    [t.group_id for t in turns],
    [t.episode_return for t in turns],
    [t.intrinsic for t in turns],
    ddof=ddof,
    eps=eps,
  )


@register_estimator("grpo_rollout")
def grpo_rollout_turns(turns, ddof=1, eps=1e-6):
  """Release GRPO, rollout level (docs/method.md §6): s = the rollout's sum of (reward + r_int),
  normalised over the group's rollouts and given to each of its turns.

  Args:
    turns: N turns (group_id, rollout_id, reward, intrinsic).
    ddof: delta degrees of freedom of the group std.
    eps: added to the std.
  Returns:
    [N] float32 advantages.
  """
  return rollout_advantages(
    [t.group_id for t in turns],
    [t.rollout_id for t in turns],
    [t.reward + t.intrinsic for t in turns],
    ddof=ddof,
    eps=eps,
  )


@register_estimator("return_positive")
def return_positive_turns(turns):
  """1 for every turn of an episode with a positive return, 0 for the rest: no baseline, no
  normalisation. With loss.policy_loss="nll" the update is supervised training on the
  successful episodes (the vault bench's positive control, docs/vault_bench.md).

  Args:
    turns: N turns (episode_return).
  Returns:
    [N] float32 advantages in {0, 1}.
  """
  return np.asarray([float(t.episode_return > 0) for t in turns], np.float32)


def gigpo_scores(turns: Sequence) -> tuple[list, list]:
  """GiGPO's two scores with EMPO2's memory reward r_int (docs/method.md §3: added to the score
  unscaled, at every step of a memory rollout).

  GiGPO's episode score is the sum of the episode's step rewards and its step return the
  discounted sum of the later ones (docs/method.md §6; docs/methods.md §4.2 items 1-2). With
  EMPO2's step reward reward + intrinsic, as grpo_rollout sums it, that is: the episode return
  plus the rollout's summed intrinsic (one value per rollout, repeated on its turns), and each
  step's reward plus its own intrinsic, before discounting. With every intrinsic 0 both equal
  the plain returns and rewards (x + 0.0 == x).

  Args:
    turns: N turns (rollout_id, episode_return, reward, intrinsic).
  Returns:
    (returns, rewards): lists of N floats, the episode returns and the step rewards.
  """
  total: dict = {}
  for t in turns:
    total[t.rollout_id] = total.get(t.rollout_id, 0.0) + float(t.intrinsic)
  returns = [t.episode_return + total[t.rollout_id] for t in turns]
  rewards = [t.reward + t.intrinsic for t in turns]
  return returns, rewards


@register_estimator(
  "gigpo", settings=("gamma", "step_weight", "use_std", "episode_stats", "invalid_penalty")
)
def gigpo_turns(turns, **kwargs):
  """GiGPO (Feng et al. 2025; docs/method.md §6): episode advantage (their Eq. 3) + w x step
  advantage over anchor states (Eqs. 5-8), with EMPO2's r_int in both scores (gigpo_scores).

  Args:
    turns: N turns (group_id, rollout_id, step, obs_key, episode_return, reward, intrinsic,
      valid).
    **kwargs: gigpo_advantages' settings (gamma, step_weight, use_std, episode_stats,
      invalid_penalty).
  Returns:
    [N] float32 advantages.
  """
  returns, rewards = gigpo_scores(turns)
  return gigpo_advantages(
    [t.group_id for t in turns],
    [t.rollout_id for t in turns],
    [t.step for t in turns],
    [t.obs_key for t in turns],
    returns,
    rewards,
    valid=[t.valid for t in turns],
    **kwargs,
  )
