"""Retrospex at act time (the action sent is the one the formula picks) and launch/retrospex.py
train on a saved-episode dataset."""

import json
import subprocess
import sys

import numpy as np
import pytest

import jax

from empo2_jax.envs.scienceworld import prompts
from empo2_jax.baselines import retrospex as R
from empo2_jax.baselines.retrospex_agent import RetrospexAgent
from empo2_jax.data import trajectories as traj
from tests.helpers import baselines_fakes as F


class _Critic:
  """q = a fixed value per action text; records its calls."""

  def __init__(self, q):
    self.q, self.calls = q, []

  def advantages(self, task, obs, actions, pad_to=0):
    self.calls.append((task, obs, list(actions)))
    return np.array([self.q.get(a, 0.0) for a in actions])


def _agent(critic, **cfg):
  from empo2_jax.model.tokenizer import load_tokenizer

  return RetrospexAgent(
    F.ScriptedPool(),
    load_tokenizer(),
    {(F.TASK, 0): F.material(0)},
    prompts.SCIENCEWORLD,
    critic,
    R.RescoreConfig(**cfg),
  )


def test_choice_is_the_formula_pick():
  texts = ["open door", "look around", "open door", "go to kitchen"]
  lps = [-0.2, -0.5, -0.3, -2.0]
  critic = _Critic({"open door": -1.0, "look around": 0.0, "go to kitchen": 5.0})
  agent = _agent(critic, top_k=3, discount=0.9, floor=0.3)
  ep = type("E", (), {"task": F.TASK, "variation": 0})()  # _choose reads task and variation
  stats = {"choices": 0, "critic_changed": 0}
  cands = R.candidates(texts, lps, 3)
  p = np.exp([lp for _, lp in cands])
  q = np.array([critic.q[c] for c, _ in cands])
  for t in (0, 3, 30):
    want = cands[R.rescore(p, q, t + 1, 0.9, 0.3)[0]][0]
    assert agent._choose(ep, "obs", texts, lps, t, stats) == want
  # early the LLM's best ("open door"), late the critic's ("go to kitchen")
  assert agent._choose(ep, "obs", texts, lps, 0, stats) == "open door"
  assert agent._choose(ep, "obs", texts, lps, 30, stats) == "go to kitchen"
  assert critic.calls[0] == ("Find the animal hidden in room 0.", "obs", [c for c, _ in cands])
  assert stats["choices"] == 5 and stats["critic_changed"] >= 2
  n = len(critic.calls)
  assert agent._choose(ep, "obs", ["look", "look"], [-1.0, -2.0], 5, stats) == "look"
  assert len(critic.calls) == n  # one candidate: no critic call


@pytest.mark.slow  # the tiny policy's sampler compiles
def test_run_sends_a_sampled_candidate_each_step():
  pool = F.ScriptedPool(length=3)
  critic = _Critic({})
  agent = RetrospexAgent(
    pool,
    F.make_actor(pool, [0]).tok,
    {(F.TASK, v): F.material(v) for v in (0, 1)},
    prompts.SCIENCEWORLD,
    critic,
    R.RescoreConfig(samples=3, top_k=2),
    F.make_actor(pool, [0]).settings,
  )
  config, params = F.tiny_policy()
  eps, stats = agent.run(
    params, config, [(F.TASK, 0, 0), (F.TASK, 1, 1)], rng=jax.random.PRNGKey(0)
  )
  assert [len(e.executed) for e in eps] == [3, 3] and all(e.score == -10 for e in eps)
  assert stats["steps"] == 6
  for e in eps:  # user, assistant alternate; the chosen texts are in the chat
    assert [m["role"] for m in e.messages] == ["user", "assistant"] * 3


def _record(i, n):
  return {
    "episode_id": f"it00000001-{i:05d}",
    "iteration": 1,
    "task": "find-animal",
    "variation": i,
    "group_id": 0,
    "rollout_id": i,
    "mode": "on",
    "use_memory": False,
    "score": 50.0,
    "success": False,
    "env_failed": False,
    "tip": "",
    "turns": {
      "observation": [f"room {t} of episode {i}" for t in range(n)],
      "prompt": ["Your task: find an animal\n\nObservation: x"] + ["y"] * (n - 1),
      "raw_action": ["look"] * n,
      "executed_action": [f"go to room {t + 1}" for t in range(n)],
      "reward": [50.0 if t == n - 1 else 0.0 for t in range(n)],
      "intrinsic": [0.0] * n,
      "advantage": [0.0] * n,
      "num_tips": [0] * n,
      "num_tokens": [0] * n,
      "lowprob_masked": [-1] * n,  # not in an update (data/trajectories.py)
      "min_old_logp": [0.0] * n,
    },
    "tips": [],
    "response_ids": [],
    "sampler_logprobs": [],
  }


@pytest.mark.slow  # IQL compiles the GRU critics
def test_launch_train_writes_a_loadable_critic(tmp_path):
  data = traj.write_dataset(lambda: [_record(i, 2 + i % 3) for i in range(8)], tmp_path / "ds")
  out = subprocess.run(
    [
      sys.executable,
      "launch/retrospex.py",
      "train",
      "--config=configs/sciworld.py:tiny",
      f"--workdir={tmp_path / 'rx'}",
      f"--episodes={data}",
      "--steps=3",
      "--batch=8",
    ],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((tmp_path / "rx" / "retrospex_train.json").read_text())
  assert summary["episode_count"] == 8 and summary["transitions"] == sum(
    2 + i % 3 for i in range(8)
  )
  assert summary["history"][-1]["steps"] == 3
  from empo2_jax.baselines import retrospex_iql as Q

  _, state, cfg, tok, meta = Q.load(str(tmp_path / "rx"))
  assert int(state.step) == 3 and cfg.batch_size == 8 and meta["reward"] == "delta"
  bad = subprocess.run(
    [
      sys.executable,
      "launch/retrospex.py",
      "eval",
      "--config=configs/sciworld.py:tiny",
      f"--workdir={tmp_path / 'none'}",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert bad.returncode != 0 and "launch/retrospex.py train" in bad.stderr
