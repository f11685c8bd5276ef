"""Advantages (docs/method.md §6), on the host with numpy: one value per turn sample.

Input format: flat arrays with one entry per turn (any order), all of length N:
  group_ids   task-row group: all turns of the n rollouts of one task row share it (hashable values)
  rollout_ids episode id, unique across the batch (hashable values)
  steps       int, the turn's index within its rollout (orders the turns for discounting)
  obs_keys    hashable, the turn's current observation (GiGPO anchor states)
  returns     float, the episode return, repeated on each of its turns
  rewards     float, the turn's own reward (env score delta, plus intrinsic when wanted)
  intrinsic   float, the turn's intrinsic (memory) reward, 0 for non-memory rollouts

Groups of a single member (one turn, one rollout, one anchor state) get advantage 0: there is no
baseline to compare against. Groups whose scores are all equal get exactly 0 (never NaN).
"""

from __future__ import annotations

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
  all turns of the group. [N] float32."""
  scores = np.asarray(returns, np.float64)
  if intrinsic is not None:
    scores = scores + np.asarray(intrinsic, np.float64)
  gid, n = _group_index(group_ids)
  return _normalise_in_groups(scores, gid, n, use_std=True, ddof=ddof, eps=eps)


def rollout_advantages(group_ids, rollout_ids, rewards, *, ddof=1, eps=1e-6):
  """Release GRPO, rollout level: score = sum of the rollout's turn rewards, normalised over the n
  rollouts of the group (ddof=1), broadcast back to every turn. [N] float32."""
  rid, n_roll = _group_index(rollout_ids)
  score = np.bincount(rid, weights=np.asarray(rewards, np.float64), minlength=n_roll)
  roll_group = np.empty(n_roll, dtype=object)
  roll_group[rid] = list(group_ids)
  gid, n_groups = _group_index(list(roll_group))
  adv = _normalise_in_groups(score, gid, n_groups, use_std=True, ddof=ddof, eps=eps)
  return adv[rid]


def discounted_returns(rollout_ids, steps, rewards, gamma):
  """G_t = sum_{k>=t} gamma^(k-t) r_k within each rollout, in step order. [N] float64."""
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
  """GiGPO (Feng et al. 2025): A = A_episode + w * A_step. [N] float32.

  Episode score of a turn = its episode return, minus `invalid_penalty` when the turn's action was
  invalid (`valid[i]` False); step return R_t = the turn's discounted return (gamma), minus the
  same penalty on invalid turns (verl-agent's apply_invalid_action_penalty, coefficient 0.1 there).
  A_episode = (score - mean) / F_norm with the group's statistics taken over
    episode_stats "trajectory": one score per rollout of the group (the rollout's first turn);
                  "steps": every turn row of the group (verl-agent's default,
                  compute_mean_std_cross_steps=True: longer episodes weigh more).
  A_step = (R_t - mean) / F_norm within the turn's anchor group (turns of the same task-row group
  whose current observation is identical; singletons -> 0).
  F_norm = std + eps with use_std=True ("mean_std_norm", the paper's "w/ std" row), 1 with
  use_std=False ("mean_norm", verl-agent's default, "w/o std"). std has ddof=1 (torch.std).
  A group with a single member gets A_episode = 0 (verl-agent: mean 0, std 1, i.e. the raw score;
  with group_size >= 2 that happens only when the pool lost the other rollouts).
  The defaults (trajectory, no penalty) are this project's earlier GiGPO; the `gigpo` method
  (train/methods.py) sets verl-agent's (steps, use_std False, penalty 0.1).
  """
  if episode_stats not in EPISODE_STATS:
    raise ValueError(f"episode_stats={episode_stats!r}; valid: {', '.join(EPISODE_STATS)}")
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
