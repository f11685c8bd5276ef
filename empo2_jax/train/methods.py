"""The method registry: each of the paper's columns (and later additions) by name, with the config
defaults it implies and the command that runs it.

    from empo2_jax.train import methods
    m = methods.get("grpo")            # Method(name, description, overrides, trains, commands, ...)
    methods.apply(config, "grpo")      # config.method = "grpo" and the method's overrides set
    m.command_lines("configs/sciworld.py:cpu", "runs/grpo")   # how to run it

`config.method` (empo2_jax/defaults.py) names the method of a run. launch/train.py applies the
method's overrides after the config file and before training, except for the keys given on the
command line (`--config.<path>=...` wins), and refuses a method that does not train, naming the
command that runs it. Methods that do not update weights run through launch/eval.py --method=NAME
(naive, reflexion) or their own script (retrospex: launch/retrospex.py train|eval).

Adding a method is ONE call at the bottom of this file (or in the module that implements it, as
long as this module imports it), e.g.

    register("sge", "Strategy-guided exploration (docs/methods.md §5)",
             overrides={"empo2.p_memory": 0.0, "explore.kind": "sge"})

`overrides` maps dotted config paths to values (every path must exist in the config:
`check_overrides` fails naming the valid keys); `trains=True` (the default) runs it with
launch/train.py; a method with its own entry point passes `commands`, templates with the fields
{config}, {workdir}, {name}, {python} and {episodes}, e.g.
("{python} launch/spa.py --config={config} --workdir={workdir}",).
`label` is its column header in launch/table.py (default: the name).
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Mapping, Optional, Sequence

TRAIN_COMMAND = (
  "{python} launch/train.py --config={config} --config.method={name} --workdir={workdir}"
)
EVAL_COMMAND = "{python} launch/eval.py --config={config} --method={name} --workdir={workdir}"


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  description: str
  overrides: Mapping[str, Any]  # dotted config path -> value, applied by `apply`
  trains: bool  # True: launch/train.py runs it (weights are updated)
  commands: tuple[str, ...]  # command templates, run in order ({python} {config} {workdir} {name})
  label: str  # column header in tables

  def command_lines(
    self,
    config: str,
    workdir: str,
    python: str = "python",
    evaluate: bool = False,
    episodes: str = "RUN_WITH_SAVED_EPISODES",
  ) -> list[str]:
    """The shell commands that run this method with config spec `config` into `workdir`;
    evaluate=True adds the evaluation of a training method's run (launch/eval.py, which writes
    the eval/result.json that launch/table.py reads; the other methods write it themselves).
    `episodes` fills {episodes} (Retrospex: runs trained with train.save_episodes=True)."""
    fields = dict(
      python=python,
      config=shlex.quote(config),
      workdir=shlex.quote(workdir),
      name=self.name,
      episodes=shlex.quote(episodes),
    )
    lines = list(self.commands) + ([EVAL_COMMAND] if evaluate and self.trains else [])
    return [c.format(**fields) for c in lines]


REGISTRY: dict[str, Method] = {}


def register(
  name: str,
  description: str,
  *,
  overrides: Optional[Mapping[str, Any]] = None,
  trains: bool = True,
  commands: Optional[Sequence[str]] = None,
  label: Optional[str] = None,
) -> Method:
  """Add a method; a name may be registered once. Returns the Method."""
  if not name or not name.replace("_", "").isalnum() or name != name.lower():
    raise ValueError(f"method name {name!r}: use lower-case letters, digits and '_'")
  if name in REGISTRY:
    raise ValueError(f"method {name!r} is registered already ({REGISTRY[name].description})")
  if commands is None:
    commands = (TRAIN_COMMAND,) if trains else (EVAL_COMMAND,)
  m = Method(
    name=name,
    description=description,
    overrides=dict(overrides or {}),
    trains=trains,
    commands=tuple(commands),
    label=label or name,
  )
  REGISTRY[name] = m
  return m


def names() -> list[str]:
  return list(REGISTRY)


class UnknownMethod(ValueError):
  pass


def get(name: str) -> Method:
  if name not in REGISTRY:
    raise UnknownMethod(f"method={name!r}; valid: {', '.join(REGISTRY)}")
  return REGISTRY[name]


def _node(config, path: str):
  """(parent ConfigDict, last key) of a dotted path; KeyError naming the valid keys."""
  parts = path.split(".")
  node = config
  for i, part in enumerate(parts):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if part not in keys:
      where = "config" + "".join(f".{p}" for p in parts[:i])
      raise KeyError(f"{path!r}: {where} has no field {part!r}; valid keys: {', '.join(keys)}")
    if i == len(parts) - 1:
      return node, part
    node = node[part]


def check_overrides(config, name: str) -> None:
  """Every path the method sets exists in `config` (KeyError naming the valid keys)."""
  for path in get(name).overrides:
    _node(config, path)


def apply(config, name: Optional[str] = None, *, keep: Sequence[str] = ()):
  """Set config.method = name (default: config.method) and the method's overrides, in place,
  except paths in `keep` (explicit command-line overrides); returns the config."""
  name = config.method if name is None else name
  m = get(name)
  keep = set(keep)
  for path, value in m.overrides.items():
    if path in keep:
      continue
    node, key = _node(config, path)
    node[key] = value
  config.method = name
  return config


def explicit_keys(argv: Sequence[str]) -> set[str]:
  """The dotted config paths set on a command line (--config.a.b=v, --config.a.b v,
  --noconfig.a.b)."""
  out = set()
  for arg in argv:
    for prefix in ("--config.", "--noconfig."):
      if arg.startswith(prefix):
        out.add(arg[len(prefix) :].split("=", 1)[0])
  return out


def not_training_message(name: str, config: str = "CONFIG", workdir: str = "WORKDIR") -> str:
  m = get(name)
  return (
    f"method {name!r} ({m.description}) does not train with launch/train.py; run it with:\n  "
    + "\n  ".join(m.command_lines(config, workdir))
  )


# What every "GRPO + its own piece" method sets: no memory, and no low-probability mask (EMPO2's
# stabiliser; the authors' GRPO config has none, docs/fidelity.md). `--config.loss.low_prob_mask`
# on the command line still wins.
GRPO_OVERRIDES = {"empo2.p_memory": 0.0, "loss.low_prob_mask": False}

# ---------------------------------------------------------------------------------------------
# The paper's columns (Table 1: Naive, Reflexion, Retrospex, GRPO, EMPO2; Table 2 adds GiGPO
# with and without std). Order = column order in launch/table.py.
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
register(
  "gigpo",
  "GiGPO as verl-agent runs it (F_norm = 1, mean_norm), no memory",
  overrides={
    **GRPO_OVERRIDES,
    "advantage.estimator": "gigpo",
    "advantage.gamma": 0.95,
    "advantage.step_weight": 1.0,
    "advantage.use_std": False,
    "advantage.episode_stats": "steps",
    "advantage.invalid_penalty": 0.1,
  },
  label="GiGPO w/o std",
)
register(
  "gigpo_std",
  "GiGPO with std normalisation (mean_std_norm), no memory",
  overrides={
    **GRPO_OVERRIDES,
    "advantage.estimator": "gigpo",
    "advantage.gamma": 0.95,
    "advantage.step_weight": 1.0,
    "advantage.use_std": True,
    "advantage.episode_stats": "steps",
    "advantage.invalid_penalty": 0.1,
  },
  label="GiGPO w/ std",
)
register(
  "grpo",
  "GRPO: EMPO2 without memory (p_memory = 0) and without the low-probability mask",
  overrides=GRPO_OVERRIDES,
  label="GRPO",
)
register("empo2", "EMPO2: memory-augmented exploration, on- and off-policy updates", label="EMPO2")

# The other exploration methods (issue 19; empo2_jax/explore/, docs/methods.md §5-8): GRPO without
# memory plus the method's own piece, except EMPO2 + RND (EMPO2 with RND's reward in place of
# 1/(n+1)). SPA runs its self-play data collection and SFT first (launch/spa.py); launch/train.py
# with method=spa runs only its RL stage (from model.checkpoint, e.g. the SFT's hf/ directory).
register(
  "sge",
  "SGE: <strategy> spans sampled at mixed temperatures (log-probs at the temperature used), "
  "strategy reflection; GRPO, no memory (explore/sge.py)",
  overrides={**GRPO_OVERRIDES, "sge.enabled": True},
  label="SGE",
)
register(
  "herl",
  "HeRL: guided re-rollouts of failed groups from their unmet goals, injected with the HE token "
  "weight and the bonus; GRPO, no memory (explore/herl.py)",
  overrides={**GRPO_OVERRIDES, "herl.enabled": True},
  label="HeRL",
)
register(
  "spa",
  "SPA: self-play world-model SFT (the true states in <observation>/<prediction>), then GRPO "
  "from it, Pass@k during RL (explore/spa.py, launch/spa.py)",
  overrides={**GRPO_OVERRIDES, "spa.enabled": True},
  commands=("{python} launch/spa.py --config={config} --config.method={name} --workdir={workdir}",),
  label="SPA",
)
register(
  "empo2_rnd",
  "EMPO2 with an RND reward on MiniLM state embeddings in place of 1/(n+1) (explore/rnd.py)",
  overrides={"empo2.intrinsic_reward": "rnd"},
  label="EMPO2+RND",
)

__all__ = [
  "Method",
  "REGISTRY",
  "register",
  "names",
  "get",
  "apply",
  "check_overrides",
  "explicit_keys",
  "not_training_message",
  "UnknownMethod",
]
