"""A scripted text environment pool and a tiny random-init policy for the baselines' tests
(Reflexion, adapt.py): the real Actor and sampler, no JVM."""

from __future__ import annotations

import numpy as np

import jax

from empo2_jax.agent.actor import Actor, ActorSettings
from empo2_jax.envs.base import ResetInfo, ResetResult, StepInfo, StepResult
from empo2_jax.envs.fewshot import PromptMaterial
from empo2_jax.envs.scienceworld.prompts import SCIENCEWORLD
from empo2_jax.model import configs, llama
from empo2_jax.model.tokenizer import load_tokenizer

TASK = "find-animal"


class ScriptedPool:
  """Episodes of `length` steps; variation v succeeds (score 100) from its `solve_at[v]`-th reset
  on (1-based), else ends with score -10. Counts resets per variation."""

  def __init__(self, length: int = 2, solve_at: dict | None = None):
    self.length, self.solve_at = length, dict(solve_at or {})
    self.resets: dict[int, int] = {}
    self._eps: list = []

  def reset(self, episodes):
    self._eps = []
    out = []
    for task, v in episodes:
      self.resets[v] = self.resets.get(v, 0) + 1
      win = self.resets[v] >= self.solve_at.get(v, 10**9)
      self._eps.append({"v": v, "steps": 0, "win": win, "done": False})
      out.append(ResetResult(f"You are in the hallway (room {v}).", ResetInfo(task, v, "find it")))
    return out

  def step(self, actions):
    out = []
    for ep, a in zip(self._eps, actions):
      if a is None:
        out.append(None)
        continue
      ep["steps"] += 1
      done = ep["steps"] >= self.length
      score = (100 if ep["win"] else -10) if done else 0
      info = StepInfo(
        score=score,
        valid=True,
        raw_action=a,
        executed_action="look around",
        steps=ep["steps"],
        success=done and ep["win"],
      )
      out.append(StepResult(f"Step {ep['steps']}: a quiet room.", float(score), done, info))
    return out


def material(v: int) -> PromptMaterial:
  return PromptMaterial(
    task_description=f"Find the animal hidden in room {v}.",
    action_templates=("look around", "go to LOC"),
    inventory="nothing",
    focus_items=(),
    few_shot=(),
  )


def tiny_policy(seed: int = 0):
  config = configs.get_preset("tiny", param_dtype="float32", compute_dtype="float32")
  params = llama.init_params(config, jax.random.PRNGKey(seed))
  return config, params


def make_actor(pool, variations, memory=None, max_new_tokens=6, tip_max_new_tokens=12):
  settings = ActorSettings(
    max_new_tokens=max_new_tokens,
    max_context=1024,
    tip_max_new_tokens=tip_max_new_tokens,
    cache_dtype="float32",
  )
  materials = {(TASK, v): material(v) for v in variations}
  return Actor(pool, load_tokenizer(), materials, memory, settings, prompt_set=SCIENCEWORLD)


def param_bytes(params) -> list[bytes]:
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(params)]
