"""What a method is to the rest of the code: a registry entry (name, config overrides, how it runs)
and, where it adds to the trainer, a Plugin (its config section, checks and hooks).

    from empo2_jax import methods
    m = methods.get("grpo")            # Method(name, description, overrides, trains, commands, ...)
    methods.apply(config, "grpo")      # config.method = "grpo" and the method's overrides set
    cli.command_lines(m, "configs/sciworld.py:cpu", "runs/grpo")   # how to run it (cli.py)
    hooks = methods.Hooks(config)      # the active plugins' hooks, as the trainer calls them

A method is one module that calls `register` (docs/architecture.md, "How to add a method"):

    class Toy(methods.Plugin):
      name, section = "toy", {"enabled": False, "bonus": 0.1}   # on while toy.enabled
      def after_rollout(self, ctx, episodes, iteration, mode, key): ...
    methods.register("toy", "a toy", overrides={"toy.enabled": True}, plugin=Toy)

`overrides` maps dotted config paths to values (every path must exist in the config: `apply`
fails naming the valid keys); `trains=True` (the default) runs it with launch/train.py; a method
with its own entry point passes `commands`, templates with the fields {config}, {workdir}, {name},
{python} and {episodes}, e.g. ("{python} launch/spa.py --config={config} --workdir={workdir}",).
`label` is its column header in launch/table.py (default: the name).

The plugin's section is added to the base config by empo2_jax/defaults.py (a method registered
before `defaults.get_config()` runs gets its section in every config built after); `check` runs
in train/build.check_config. Plugins are active by their own config (`active`), not by
config.method, so that e.g. `--config.sge.enabled=True` on a GRPO run turns SGE on as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

from empo2_jax import config_keys


@dataclasses.dataclass(frozen=True)
class RolloutContext:
  """What a plugin may do with the trainer after a rollout, and nothing more.

  rollout(specs, *, notes, temperature, rng) -> Rollout: episodes of the current policy without
  memory (mode 'on') on specs [(task, variation, group_id)], each opening with its note.
  seed: the run's seed. score_out_of: the env's full score (prompts.score_out_of).
  chats_with_tips(episode, tips_per_step, turns=None) -> the turns' chats with those tips shown
  (agent/actor.Actor.chats_with_tips: the teacher views of the loss terms).
  memory_entries: the tips the memory slots of the iteration's variations held when its rollout
  began (None: not known)."""

  rollout: Callable
  seed: int
  score_out_of: Any = 100
  chats_with_tips: Optional[Callable] = None
  memory_entries: Optional[int] = None


class Plugin:
  """A method's additions to the trainer. Subclass it, set `name` and `section` (its config
  section's defaults, or None for none), override what the method changes; every hook's default
  changes nothing. One instance per run, built when `active(config)` holds."""

  name: ClassVar[str] = ""
  section: ClassVar[Optional[Mapping[str, Any]]] = None
  # Whether the sampler's per-token log-probs may serve as the update's old ones (False for
  # methods that train tokens sampled at other temperatures or prompts; train/settings.py).
  sampler_logprobs: ClassVar[bool] = True
  # Methods that each rewrite the episode's text or turns (SGE, HeRL, SPA): at most one is on.
  exclusive: ClassVar[bool] = False
  # What the actor records in each episode's extras for the method (agent/episode.RECORDS; SPA:
  # "states"); nothing is recorded that no active method asks for.
  episode_records: ClassVar[tuple] = ()

  # -- config (class-level: no instance exists yet) ---------------------------------------------
  @classmethod
  def add_defaults(cls, c) -> None:
    """Put the method's section into the base config `c` (unlocked)."""
    if cls.section is not None:
      c[cls.name] = dict(cls.section)

  @classmethod
  def check(cls, c) -> None:
    """ValueError naming the valid values of a bad field of the method's section."""

  @classmethod
  def active(cls, c) -> bool:
    """Whether the run uses the method: by default its section's `enabled` field (a section
    without one: never; override for another rule, as RND's empo2.intrinsic_reward)."""
    return bool(cls.section is not None and "enabled" in cls.section and c[cls.name].enabled)

  @classmethod
  def extra_response_tokens(cls, c) -> int:
    """Response tokens the method adds to rollout.max_new_tokens (when active)."""
    return 0

  # -- hooks -------------------------------------------------------------------------------------
  def __init__(self, c, *, encoder=None, score_out_of=100):
    self.c = c
    self.encoder = encoder
    self.score_out_of = score_out_of

  def score_text(self, score: float) -> str:
    """A score as the env's prompts write it ("35/100")."""
    from empo2_jax.memory.reflect import format_score

    out = self.score_out_of
    return f"{format_score(score)}/{format_score(out)}" if out else format_score(score)

  def env_text(self, response: str) -> str:
    """What of a response the env reads as the action."""
    return response

  def train_notes(self, specs: Sequence, iteration: int) -> Optional[list[str]]:
    """A note opening each training episode's first user message (None: none)."""
    return None

  def eval_notes(self, specs: Sequence) -> Optional[list[str]]:
    return None

  def train_sampler(self):
    """A per-step sampler for training rollouts (agent/actor.py's `sampler`), or None."""
    return None

  def memory_view(self, mode: str) -> Optional[str]:
    """How an iteration of `mode` uses memory: "shown" (tips in the prompts), "shadow" (tips
    retrieved and kept per step, not shown: Actor.rollout's shadow_memory), "split" (each
    group's first rollout.group_size // 2 rollouts shown, the rest shadow) or "none"; None
    leaves it to the mode (shown unless mode is "on")."""
    return None

  def after_rollout(self, ctx: RolloutContext, episodes: list, iteration: int, mode: str, key):
    """(episodes to train on, metrics). Runs on every host with the same gathered episodes."""
    return episodes, {}

  def state_tree(self):
    """Arrays to checkpoint with the train state, or None."""
    return None

  def meta(self) -> dict:
    """JSON-able state for the checkpoint's meta (keys shared by all plugins: make them unique)."""
    return {}

  def load(self, tree, meta: dict) -> None:
    """Restore what state_tree/meta saved (tree None: nothing was saved)."""


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  description: str
  overrides: Mapping[str, Any]  # dotted config path -> value, applied by `apply`
  trains: bool  # True: launch/train.py runs it (weights are updated)
  # Its own launch command templates, run in order ({python} {config} {workdir} {name}
  # {episodes}); (): the standard launch script (empo2_jax/cli.command_lines renders them)
  commands: tuple[str, ...]
  label: str  # column header in tables
  plugin: Optional[type] = None  # its Plugin subclass, if it adds to the trainer


# What every "GRPO + its own piece" method sets: no memory, and no low-probability mask (EMPO2's
# stabiliser; the authors' GRPO config has none, docs/fidelity.md). `--config.loss.low_prob_mask`
# on the command line still wins.
GRPO_OVERRIDES = {"empo2.p_memory": 0.0, "loss.low_prob_mask": False}

MEMORY_VIEWS = ("shown", "shadow", "split", "none")  # Plugin.memory_view
REGISTRY: dict[str, Method] = {}
PLUGINS: list[type] = []  # registration order = the order the hooks run in


class UnknownMethod(ValueError):
  pass


def register_plugin(plugin: type) -> type:
  """Add a Plugin subclass (once; `register(..., plugin=)` calls this)."""
  if not (isinstance(plugin, type) and issubclass(plugin, Plugin)) or not plugin.name:
    raise TypeError(f"{plugin!r}: a plugin is a methods.Plugin subclass with a `name`")
  clash = [p for p in PLUGINS if p.name == plugin.name and p is not plugin]
  if clash:
    raise ValueError(f"plugin {plugin.name!r} is registered already ({clash[0].__module__})")
  if plugin not in PLUGINS:
    PLUGINS.append(plugin)
  return plugin


def register(
  name: str,
  description: str,
  *,
  overrides: Optional[Mapping[str, Any]] = None,
  trains: bool = True,
  commands: Sequence[str] = (),
  label: Optional[str] = None,
  plugin: Optional[type] = None,
) -> Method:
  """Add a method; a name may be registered once. Returns the Method."""
  if not name or not name.replace("_", "").isalnum() or name != name.lower():
    raise ValueError(f"method name {name!r}: use lower-case letters, digits and '_'")
  if name in REGISTRY:
    raise ValueError(f"method {name!r} is registered already ({REGISTRY[name].description})")
  if plugin is not None:
    register_plugin(plugin)
  m = Method(
    name=name,
    description=description,
    overrides=dict(overrides or {}),
    trains=trains,
    commands=tuple(commands),
    label=label or name,
    plugin=plugin,
  )
  REGISTRY[name] = m
  return m


def names() -> list[str]:
  return list(REGISTRY)


def get(name: str) -> Method:
  if name not in REGISTRY:
    raise UnknownMethod(f"method={name!r}; valid: {', '.join(REGISTRY)}")
  return REGISTRY[name]


def check_overrides(config, name: str) -> None:
  """Every path the method sets exists in `config` (KeyError naming the valid keys)."""
  for path in get(name).overrides:
    config_keys.lookup(config, path)


def apply(config, name: Optional[str] = None, *, keep: Sequence[str] = ()):
  """Set config.method = name (default: config.method) and the method's overrides, in place,
  except paths in `keep` (explicit command-line overrides); returns the config."""
  name = config.method if name is None else name
  m = get(name)
  keep = set(keep)
  for path, value in m.overrides.items():
    if path in keep:
      continue
    node, key = config_keys.lookup(config, path)
    node[key] = value
  config.method = name
  return config


# -- the plugins' config ---------------------------------------------------------------------------
def add_sections(c) -> None:
  """Every registered plugin's section into the base config `c` (unlocked; defaults.py)."""
  for p in PLUGINS:
    if p.section is not None and p.name in c:
      raise ValueError(f"method plugin {p.name!r}: the config has a section {p.name!r} already")
    p.add_defaults(c)


def check(c) -> None:
  """config.method is registered, and every plugin's section checks (ValueError naming the valid
  values)."""
  if c.method not in REGISTRY:
    raise UnknownMethod(f"method={c.method!r}; valid: {', '.join(REGISTRY)}")
  for p in PLUGINS:
    p.check(c)
  on = [p.name for p in active(c) if p.exclusive]
  if len(on) > 1:
    raise ValueError(f"{', '.join(n + '.enabled' for n in on)}: at most one of them at a time")


def active(c) -> list[type]:
  return [p for p in PLUGINS if p.active(c)]


def response_tokens(c) -> int:
  """The response budget of one turn: rollout.max_new_tokens plus what the active methods add
  (SGE's strategy phase, SPA's world-model text); also the batch's response length."""
  return int(c.rollout.max_new_tokens) + sum(int(p.extra_response_tokens(c)) for p in active(c))


def episode_records(c) -> tuple:
  """What the active methods ask the actor to record in Episode.extras (Plugin.episode_records),
  sorted."""
  return tuple(sorted({r for p in active(c) for r in p.episode_records}))


def sampler_logprobs_blockers(c) -> list[str]:
  """The active methods whose trained tokens the sampler drew otherwise (Plugin.sampler_logprobs
  False): while any is on, the sampler's log-probs cannot serve as old ones (train/settings.py)."""
  return [p.name for p in active(c) if not p.sampler_logprobs]


class Hooks:
  """The active plugins of a run, called in registration order: what the trainer and the actor
  call (train/trainer.py). Checkpoint state is keyed by plugin name."""

  def __init__(self, c, *, encoder=None, score_out_of=100):
    check(c)
    self.plugins = [p(c, encoder=encoder, score_out_of=score_out_of) for p in active(c)]
    samplers = [p.name for p in self.plugins if type(p).train_sampler is not Plugin.train_sampler]
    if len(samplers) > 1:
      raise ValueError(f"methods {', '.join(samplers)} each bring a sampler: turn one off")

  def env_text(self, response: str) -> str:
    for p in self.plugins:
      response = p.env_text(response)
    return response

  @staticmethod
  def _notes(lists) -> Optional[list[str]]:
    lists = [x for x in lists if x is not None]
    if not lists:
      return None
    return ["\n".join(parts) for parts in zip(*lists)]

  def train_notes(self, specs: Sequence, iteration: int) -> Optional[list[str]]:
    return self._notes(p.train_notes(specs, iteration) for p in self.plugins)

  def eval_notes(self, specs: Sequence) -> Optional[list[str]]:
    return self._notes(p.eval_notes(specs) for p in self.plugins)

  def train_sampler(self):
    for p in self.plugins:
      s = p.train_sampler()
      if s is not None:
        return s
    return None

  def memory_view(self, mode: str) -> str:
    """The first plugin's Plugin.memory_view, else "shown" for a memory mode, "none" for "on"."""
    views = [v for v in (p.memory_view(mode) for p in self.plugins) if v is not None]
    if len(set(views)) > 1:
      raise ValueError(f"the active methods disagree on the memory of a {mode!r} iteration")
    if views and views[0] not in MEMORY_VIEWS:
      raise ValueError(f"memory_view {views[0]!r}; valid: {', '.join(MEMORY_VIEWS)}")
    return views[0] if views else ("none" if mode == "on" else "shown")

  def after_rollout(self, ctx: RolloutContext, episodes: list, iteration: int, mode: str, key):
    metrics: dict = {}
    for p in self.plugins:
      episodes, m = p.after_rollout(ctx, episodes, iteration, mode, key)
      metrics.update(m)
    return episodes, metrics

  def state_tree(self):
    tree = {p.name: p.state_tree() for p in self.plugins}
    tree = {k: v for k, v in tree.items() if v is not None}
    return tree or None

  def meta(self) -> dict:
    out: dict = {}
    for p in self.plugins:
      out.update(p.meta())
    return out

  def load(self, tree, meta: Optional[dict]) -> None:
    tree = dict(tree or {})
    for p in self.plugins:
      p.load(tree.get(p.name), dict(meta or {}))


__all__ = [
  "RolloutContext",
  "Plugin",
  "Method",
  "GRPO_OVERRIDES",
  "MEMORY_VIEWS",
  "REGISTRY",
  "PLUGINS",
  "UnknownMethod",
  "register_plugin",
  "register",
  "names",
  "get",
  "check_overrides",
  "apply",
  "add_sections",
  "check",
  "active",
  "response_tokens",
  "episode_records",
  "sampler_logprobs_blockers",
  "Hooks",
]
