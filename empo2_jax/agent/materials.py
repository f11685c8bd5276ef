"""Prompt material for the actor: {(task, variation): material} from an env's registry entry."""

from __future__ import annotations

from typing import Sequence

from empo2_jax.envs.fewshot import PromptMaterial  # ScienceWorld's material (re-exported)


def material_for(
  env, task: str, variations: Sequence[int], n_few_shot: int = 2, env_name: str = "scienceworld"
) -> dict:
  """{(task, variation): material} from a local env of `env_name` (envs/registry.py); few-shot
  examples come from train variations only."""
  from empo2_jax.envs import registry

  return registry.get_suite(env_name).materials(env, task, list(variations), n_few_shot)


__all__ = ["PromptMaterial", "material_for"]
