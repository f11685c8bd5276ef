"""The methods: one module each, and the interface they plug into (methods/base.py).

  base.py       the registry (Method: name, config overrides, how it runs), the Plugin interface
                (a method's config section, checks and trainer hooks), Hooks (a run's active
                plugins, as the trainer calls them) and RolloutContext (what a hook may roll out)
  baselines.py  naive, reflexion, retrospex: no weight updates (registry entries only)
  gigpo.py      gigpo, gigpo_std: GRPO with the group-in-group advantage (rl/advantages.py)
  grpo.py       grpo: EMPO2 without memory and without the low-probability mask
  empo2.py      empo2: its `empo2` section and checks (the method is the trainer's core)
  sge.py        sge: strategy spans at mixed temperatures, strategy reflection
  herl.py       herl: hindsight-guided re-rollouts of failed groups
  spa.py        spa: self-play world-model SFT data (train/spa_run.py), then RL on <answer>
  rnd.py        empo2_rnd: RND's reward in place of EMPO2's 1/(n+1)
  empo2_release.py  empo2_release: EMPO2 as the authors shipped it (release ratio, no mask)
  ctx_distill.py  ctx_distill: on-policy context distillation (shadow retrieval, reverse KL)
  opid.py       opid: the hindsight tip's token advantage

Importing this package registers them all, in the order of launch/table.py's columns (Table 1:
Naive, Reflexion, Retrospex, GRPO, EMPO2; Table 2 adds GiGPO with and without std; then the
other exploration methods). Each module keeps its math and text in pure functions (tested
against numpy / hand-computed values) and its trainer side in one Plugin class. A new method is
one more module: docs/architecture.md, "How to add a method".
"""

from empo2_jax.methods import baselines, gigpo, grpo, empo2, sge, herl, spa, rnd  # noqa: F401
from empo2_jax.methods import empo2_release, ctx_distill, opid  # noqa: F401
from empo2_jax.methods.base import (
  GRPO_OVERRIDES,
  PLUGINS,
  REGISTRY,
  Hooks,
  Method,
  Plugin,
  RolloutContext,
  UnknownMethod,
  active,
  add_sections,
  apply,
  check,
  check_overrides,
  episode_records,
  get,
  names,
  register,
  register_plugin,
  response_tokens,
  sampler_logprobs_blockers,
)

__all__ = [
  "GRPO_OVERRIDES",
  "PLUGINS",
  "REGISTRY",
  "Hooks",
  "Method",
  "Plugin",
  "RolloutContext",
  "UnknownMethod",
  "active",
  "add_sections",
  "apply",
  "check",
  "check_overrides",
  "episode_records",
  "get",
  "names",
  "register",
  "register_plugin",
  "response_tokens",
  "sampler_logprobs_blockers",
]
