"""The paper's methods that update no weights (Table 1's Naive, Reflexion and Retrospex): registry
entries only. Each runs through launch/eval.py --method=NAME or its own script."""

from __future__ import annotations

from empo2_jax.methods.base import register

register("naive", "the base model, no memory, no weight updates", trains=False, label="Naive")
register(
  "reflexion",
  "Reflexion: K trials per test variation, verbal reflections in context, no weight updates "
  "(empo2_jax/baselines/reflexion.py)",
  trains=False,
  label="Reflexion",
)
register(
  "retrospex",
  "Retrospex: an offline IQL critic on saved episodes re-scores the LLM's candidate actions "
  "(empo2_jax/baselines/retrospex.py)",
  trains=False,
  commands=(
    "{python} launch/retrospex.py train --config={config} --workdir={workdir} "
    "--episodes={episodes}",
    "{python} launch/retrospex.py eval --config={config} --workdir={workdir}",
  ),
  label="Retrospex",
)
