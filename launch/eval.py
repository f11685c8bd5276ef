"""Evaluate a method on its task's test variations: the paper's Table 1 shape.
(--split=train or dev evaluates those variations instead, to choose a setting without test.)

  python launch/eval.py --config=configs/sciworld.py:cpu --workdir=runs/cpu [--memory=both]
  python launch/eval.py --config=configs/sciworld.py:cpu --method=grpo --workdir=runs/grpo
  python launch/eval.py --config=configs/sciworld.py:cpu --method=naive --workdir=runs/naive
  python launch/eval.py --config=configs/sciworld.py:cpu --method=reflexion --workdir=runs/rx \
      --trials=10 --reflections=3

--method (default: the config's method, empo2_jax/methods/):
  a training method (empo2, grpo, gigpo, ...): loads the newest restorable checkpoint of --workdir
      (a workdir without one is refused, exit 2, and nothing is created; --initial evaluates the
      config's initial policy instead of any checkpoint) and runs test variations x
      train.eval_repeats episodes at train.eval_temperature, without memory (the paper's number),
      with the run's memory, or both (--memory).
  naive: the config's initial policy (the base model), no memory, nothing updated.
  reflexion: the initial policy, --trials trials per test variation with the last --reflections
      reflections in context (empo2_jax/baselines/reflexion.py); reports the last trial and the
      per-trial curve.
  retrospex: has its own script, launch/retrospex.py eval.
Uses the same --config (and overrides) as training; the method's config defaults are applied
(command-line keys win). Prints a markdown table and writes <workdir>/eval/table.md, table.csv and
result.json (what launch/table.py reads), through etils.epath (the workdir may be gs://).
"""

import json
import sys
import warnings

# ScienceWorld starts its JVM with fork+exec; Python warns about fork in a threaded process, which
# does not apply to an immediate exec.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from etils import epath  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "the run's workdir", required=True)
_METHOD = flags.DEFINE_string(
  "method", "", "the method to evaluate (default: config.method); empo2_jax/methods/"
)
_MEMORY = flags.DEFINE_enum(
  "memory",
  "without",
  ["without", "with", "both"],
  "training methods: evaluate without the run's memory (the paper's number), with it, or both",
)
_SPLIT = flags.DEFINE_enum(
  "split",
  "test",
  ["test", "dev", "train"],
  "the variations evaluated: test (the first env.num_test_variations; the reported number), "
  "or train (the first env.num_train_variations) / dev (the first env.num_test_variations dev "
  "variations) to choose a setting, e.g. the target task, without looking at test variations",
)
_OUT = flags.DEFINE_string(
  "out", "", "where eval/ (table.md, table.csv, result.json) is written; default: --workdir"
)
_LABEL = flags.DEFINE_string(
  "label",
  "",
  "the method name result.json records (launch/table.py's column; default: the method), e.g. "
  "empo2_rule for an EMPO2 run with empo2.reflector=rule",
)
_INITIAL = flags.DEFINE_bool(
  "initial",
  False,
  "training methods: evaluate the config's initial policy, not a checkpoint (without it, a "
  "workdir with no checkpoint is refused)",
)
_EPISODES = flags.DEFINE_string(
  "episodes",
  "",
  "training methods: also write the evaluated episodes to this directory (gs:// too), one "
  "JSONL file per memory setting (without.jsonl, with.jsonl) of data/trajectories.episode_record "
  "dicts; launch/probe.py --make reads them",
)
_TRIALS = flags.DEFINE_integer("trials", 10, "reflexion: trials per test variation")
_REFLECTIONS = flags.DEFINE_integer("reflections", 3, "reflexion: reflections kept in context")
_REFLECTION_TOKENS = flags.DEFINE_integer(
  "reflection_tokens", 128, "reflexion: max new tokens of a reflection"
)


def write_tables(workdir, rows: list[dict]) -> str:
  """<workdir>/eval/table.md and table.csv from evaluate.summarize rows; returns the markdown."""
  from empo2_jax.train import evaluate

  out_dir = epath.Path(workdir) / "eval"
  out_dir.mkdir(parents=True, exist_ok=True)
  md = evaluate.table_markdown(rows)
  (out_dir / "table.md").write_text(md)
  (out_dir / "table.csv").write_text(evaluate.table_csv(rows))
  return md


def _evaluate_policy(trainer, config, method, with_memory_settings):
  """(table rows, result kwargs) of plain evaluation episodes."""
  from empo2_jax.train import evaluate

  rows, result = [], None
  for with_memory in with_memory_settings:
    episodes = [e for e in trainer.eval_episodes(with_memory) if not e.env_failed]
    if _EPISODES.value:
      _write_episodes(_EPISODES.value, "with" if with_memory else "without", episodes, trainer)
    setting = "with memory" if with_memory else "no memory"
    returns = [e.episode_return for e in episodes]
    successes = [e.success for e in episodes]
    rows.append(evaluate.summarize(config.env.task, f"{method}, {setting}", returns, successes))
    if result is None:  # the first setting asked for: without memory unless only 'with'
      extra = {"setting": setting, "iteration": trainer.iteration}
      result = dict(returns=returns, successes=successes, extra=extra)
  return rows, result


def _write_episodes(directory, name: str, episodes, trainer) -> None:
  from empo2_jax.data.trajectories import episode_record

  out = epath.Path(directory)
  out.mkdir(parents=True, exist_ok=True)
  lines = [json.dumps(episode_record(e, trainer.iteration)) + "\n" for e in episodes]
  (out / f"{name}.jsonl").write_text("".join(lines))


def _reflexion(trainer, config):
  from empo2_jax.baselines import reflexion as rx
  from empo2_jax.train import evaluate

  import jax

  cfg = rx.ReflexionConfig(
    trials=_TRIALS.value,
    memory_size=_REFLECTIONS.value,
    max_new_tokens=_REFLECTION_TOKENS.value,
  )
  params = trainer.sampling_params()
  writer = rx.policy_writer(
    params,
    trainer.model_config,
    trainer.tokenizer,
    cfg,
    config.rollout.max_context,
    trainer.actor.sampler_settings,
  )
  res = rx.run(
    trainer.actor,
    params,
    trainer.model_config,
    config.env.task,
    trainer.test_variations,
    cfg,
    temperature=config.train.eval_temperature,
    rng=jax.random.fold_in(trainer.rng, 20_000_000),
    writer=writer,
    out_of=trainer.actor.prompts.score_out_of,
  )
  rows = [
    evaluate.summarize(
      config.env.task, f"reflexion, trial {c['trial']}", res.returns[k], res.successes[k]
    )
    for k, c in enumerate(res.curve())
  ]
  extra = {
    "setting": f"last of {cfg.trials} trials",
    "trials": res.curve(),
    "reflexion": {"trials": cfg.trials, "memory_size": cfg.memory_size},
    "reflections": {str(v): [t for _, t in r] for v, r in res.reflections.items()},
  }
  result = dict(
    returns=[float(x) for x in res.final_returns],
    successes=[bool(x) for x in res.final_successes],
    extra=extra,
  )
  return rows, result


def use_split(trainer, config, split: str) -> list:
  """Points `trainer`'s evaluation (its test_variations) at `split`'s variations and returns them:
  test as built; train: the training rows (their prompt material exists); dev: the first
  env.num_test_variations dev variations, whose prompt material is built here."""
  from empo2_jax.train import build

  if split == "train":
    trainer.test_variations = list(trainer.train_variations)
  elif split == "dev":
    env = build.suite(config).local_env(build.env_config(config))
    try:
      rows = env.variations(config.env.task, "dev")[: config.env.num_test_variations]
      trainer.actor.materials.update(build.materials(config, env, rows))
    finally:
      env.close()
    trainer.test_variations = list(rows)
  elif split != "test":
    raise ValueError(f"split={split!r}; valid: test, dev, train")
  return list(trainer.test_variations)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # keep orbax's INFO lines out of the way
    logging.set_verbosity(logging.WARNING)
  from empo2_jax.baselines.results import write_result
  from empo2_jax import methods
  from empo2_jax.train import evaluate
  from empo2_jax.train.build import ConfigError
  from empo2_jax.train.trainer import Trainer

  config = _CONFIG.value
  name = _METHOD.value or config.method
  try:
    method = methods.get(name)
  except methods.UnknownMethod as e:
    cli.fail(e)  # one line, exit 2
  if name == "retrospex":
    sys.exit(
      "error: retrospex has its own entry point:\n  "
      + "\n  ".join(cli.command_lines(method, _config_spec(), _WORKDIR.value))
    )
  methods.apply(config, name, keep=cli.explicit_keys(sys.argv[1:]))
  try:
    trainer = Trainer(config, _WORKDIR.value, progress=False)
  except ConfigError as e:
    cli.fail(e)  # one line, exit 2
  try:
    rows_evaluated = use_split(trainer, config, _SPLIT.value)
    if method.trains and not _INITIAL.value:  # _check_checkpoint found a step to restore
      try:
        trainer.resume(read_only=True)
      except RuntimeError as e:  # checkpoints there, none restorable
        cli.fail(e)  # one line, exit 2
    if method.trains:
      settings = {"without": [False], "with": [True], "both": [False, True]}[_MEMORY.value]
      rows, result = _evaluate_policy(trainer, config, name, settings)
    elif name == "reflexion":
      rows, result = _reflexion(trainer, config)
    else:  # naive and any other non-training method run plainly: the base model, no memory
      rows, result = _evaluate_policy(trainer, config, name, [False])
  finally:
    trainer.close()
  result["extra"].update(
    split=_SPLIT.value, variations=[int(v) for v in rows_evaluated], seed=int(config.seed)
  )
  out_dir = _OUT.value or _WORKDIR.value
  md = write_tables(out_dir, evaluate.with_average(rows))
  path = write_result(
    out_dir,
    method=_LABEL.value or name,
    task=config.env.task,
    env=config.env.name,
    returns=result["returns"],
    successes=result["successes"],
    extra=result["extra"],
  )
  print(
    f"{name} on {config.env.task} ({_SPLIT.value} variations: {len(rows_evaluated)}; "
    f"{_WORKDIR.value}, iteration {trainer.iteration})"
  )
  print(md, end="")
  print(f"result: {path}")
  if name == "reflexion":
    print("per trial: " + json.dumps(result["extra"]["trials"]))


def _check_checkpoint(flag_values) -> None:
  """Before anything starts: a training method's --workdir must hold a checkpoint step, unless
  --initial asks for the initial policy (cli.UserError otherwise; nothing is created)."""
  from empo2_jax import methods

  name = flag_values.method or flag_values.config.method
  try:
    trains = methods.get(name).trains
  except methods.UnknownMethod:
    return  # main names the valid methods
  if not trains or flag_values.initial:
    return
  ckpts = epath.Path(flag_values.workdir) / "checkpoints"
  steps = [p for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.is_dir() else []
  if not steps:
    raise cli.UserError(
      "no checkpoint to evaluate",
      str(ckpts),
      "check --workdir (a run of launch/train.py), or pass --initial to evaluate the initial "
      "policy",
    )


def _config_spec() -> str:
  return next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--config=")), "CONFIG")


if __name__ == "__main__":
  # one-line errors for config, checkpoint and path mistakes (exit 2)
  cli.run(main, checks=(_check_checkpoint,))
