"""Retrospex (docs/methods.md §3): train an offline IQL critic on saved episodes, then act with
the LLM's candidates re-scored by it.

  python launch/retrospex.py train --config=configs/sciworld.py:cpu --workdir=runs/retrospex \
      --episodes=runs/naive_train,runs/grpo          # runs saved with train.save_episodes=True
  python launch/retrospex.py eval --config=configs/sciworld.py:cpu --workdir=runs/retrospex

train: every episode of the --episodes datasets (run workdirs, their episodes/ directories or TFDS
  version directories; data/trajectories.py) -> transitions (baselines/retrospex_data.py), a
  SentencePiece unigram tokenizer (--vocab, 8k), IQL (baselines/retrospex_iql.py: --steps, --passes,
  --batch, --twin_q; expectile 0.7, gamma 0.99, Polyak 0.005, lr 1e-4). Writes the critic
  (<workdir>/critic, orbax), tokenizer.model, critic.json, retrospex_train.json (losses per pass).
eval: the config's policy (the base model, or --config.model.checkpoint=DIR, e.g. an SFT
  checkpoint, as Retrospex's imitation-learned agent) on the task's test variations x
  train.eval_repeats: K = --samples candidates per step at temperature 1, top --top_k by
  log-prob, re-scored with lambda_t = max(--floor, --discount^t) (ScienceWorld: 0.6, 0.97).
  Writes <workdir>/eval/result.json (launch/table.py), table.md and table.csv.
--workdir and --episodes may be gs:// (etils.epath, needs gcsfs; the critic through orbax): the
  episode datasets are read through temporary local copies, every output goes to the workdir.
"""

import dataclasses
import json
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from empo2_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "config file (path[:arg])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "where the critic and results go", required=True)
_EPISODES = flags.DEFINE_string("episodes", "", "train: comma-separated episode datasets / runs")
_REWARD = flags.DEFINE_enum("reward", "delta", ["delta", "spread"], "train: transition rewards")
_VOCAB = flags.DEFINE_integer("vocab", 8000, "train: SentencePiece vocabulary (a soft limit)")
_STEPS = flags.DEFINE_integer("steps", 20000, "train: at most this many IQL updates")
_PASSES = flags.DEFINE_integer("passes", 20, "train: at most this many passes over the data")
_BATCH = flags.DEFINE_integer("batch", 128, "train: transitions per update")
_TWIN_Q = flags.DEFINE_bool("twin_q", False, "train: twin Q networks (Retrospex's WebShop critic)")
_SAMPLES = flags.DEFINE_integer("samples", 4, "eval: candidates sampled per step")
_TOP_K = flags.DEFINE_integer("top_k", 4, "eval: candidates kept by log-prob")
_DISCOUNT = flags.DEFINE_float("discount", 0.97, "eval: d of lambda_t = max(b, d^t)")
_FLOOR = flags.DEFINE_float("floor", 0.6, "eval: b of lambda_t = max(b, d^t)")


def train(config) -> None:
  from empo2_jax.baselines import retrospex_data as D
  from empo2_jax.baselines import retrospex_iql as Q

  paths = [p for p in _EPISODES.value.split(",") if p]
  if not paths:
    sys.exit("error: train needs --episodes=RUN[,RUN...] (runs saved with train.save_episodes)")
  try:
    records = D.read_records(paths)
  except FileNotFoundError as e:
    cli.fail(e)  # one line, exit 2
  trans = D.transitions(records, reward=_REWARD.value)
  if not trans:
    sys.exit(f"error: no transitions in {paths} (every episode env_failed or empty)")
  t0 = time.perf_counter()
  proto = D.train_tokenizer(D.corpus(trans), vocab_size=_VOCAB.value)
  tok = D.Tokenizer(proto)
  arrays = D.encode_transitions(trans, tok)
  cfg = Q.IQLConfig(
    twin_q=_TWIN_Q.value,
    steps=_STEPS.value,
    max_passes=_PASSES.value,
    batch_size=_BATCH.value,
    seed=config.seed,
  )
  print(
    f"{len(records)} episodes, {len(trans)} transitions, vocabulary {tok.vocab_size}; "
    f"IQL: up to {cfg.steps} steps / {cfg.max_passes} passes of batch {cfg.batch_size}",
    flush=True,
  )

  def log(step, rec):
    print(
      f"pass {rec['pass']} step {step}: q_loss {rec['q_loss']:.4g} v_loss {rec['v_loss']:.4g}",
      flush=True,
    )

  _, state, history = Q.train(arrays, tok.vocab_size, cfg, log=log)
  meta = {
    "episodes": paths,
    "transitions": len(trans),
    "episode_count": len(records),
    "reward": _REWARD.value,
    "max_len": D.DEFAULT_MAX_LEN,
  }
  Q.save(_WORKDIR.value, state, cfg, proto, meta)
  summary = dict(meta, history=history, seconds=time.perf_counter() - t0, vocab=tok.vocab_size)
  from etils import epath

  (epath.Path(_WORKDIR.value) / "retrospex_train.json").write_text(json.dumps(summary, indent=1))
  print(f"critic saved in {_WORKDIR.value} ({int(state.step)} updates)")


def evaluate(config) -> None:
  import jax

  from empo2_jax.baselines import retrospex as R
  from empo2_jax.baselines import retrospex_iql as Q
  from empo2_jax.baselines.results import write_result
  from empo2_jax.baselines.retrospex_agent import Critic, RetrospexAgent
  from empo2_jax.train import build
  from empo2_jax.train import evaluate as ev
  from empo2_jax.train.settings import actor_settings

  try:
    nets, state, _, tok, meta = Q.load(_WORKDIR.value)
  except FileNotFoundError as e:
    cli.fail(e)  # one line, exit 2
  try:
    build.check_config(config)
  except build.ConfigError as e:
    cli.fail(e)  # one line, exit 2
  rescore = R.RescoreConfig(
    samples=_SAMPLES.value, top_k=_TOP_K.value, discount=_DISCOUNT.value, floor=_FLOOR.value
  )
  model_config, params = build.policy(config)
  tokenizer = build.tokenizer(config)
  pool, env = build.envs(config)
  try:
    test_variations = env.used_variations(config.env.task, "test")
    materials = build.materials(config, env, test_variations)
  except BaseException:
    pool.close()
    raise
  finally:
    env.close()
  try:
    agent = RetrospexAgent(
      pool,
      tokenizer,
      materials,
      build.suite(config).prompts,
      Critic(nets, state, tok, dict(meta.get("max_len", {}))),
      rescore,
      actor_settings(config),
    )
    specs = [
      (config.env.task, v, g)
      for g, v in enumerate(test_variations)
      for _ in range(config.train.eval_repeats)
    ]
    episodes, stats = agent.run(params, model_config, specs, rng=jax.random.PRNGKey(config.seed))
  finally:
    pool.close()
  ok = [e for e in episodes if not e.env_failed]
  returns, successes = [e.episode_return for e in ok], [e.success for e in ok]
  rows = [ev.summarize(config.env.task, "retrospex", returns, successes)]
  from etils import epath

  out = epath.Path(_WORKDIR.value) / "eval"
  out.mkdir(parents=True, exist_ok=True)
  md = ev.table_markdown(rows)
  (out / "table.md").write_text(md)
  (out / "table.csv").write_text(ev.table_csv(rows))
  extra = {"rescore": dataclasses.asdict(rescore), **stats}
  path = write_result(
    _WORKDIR.value,
    method="retrospex",
    task=config.env.task,
    env=config.env.name,
    returns=returns,
    successes=successes,
    extra=extra,
  )
  print(md, end="")
  print(
    f"critic changed the LLM's choice {stats['critic_changed']} of "
    f"{stats['choices']} times; result: {path}"
  )


def main(argv):
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  commands = [a for a in argv[1:] if not a.startswith("-")]
  if commands not in (["train"], ["eval"]):
    sys.exit("usage: launch/retrospex.py train|eval --config=... --workdir=... (see --help)")
  from empo2_jax import methods

  config = _CONFIG.value
  methods.apply(config, "retrospex", keep=cli.explicit_keys(sys.argv[1:]))
  from etils import epath

  epath.Path(_WORKDIR.value).mkdir(parents=True, exist_ok=True)  # gs://: nothing to make
  if commands == ["train"]:
    train(config)
  else:
    evaluate(config)


def _check_paths(flag_values) -> None:
  """gs:// without gcsfs or credentials: one line before anything starts (data/storage.py)."""
  from empo2_jax.data.storage import check_gcs_access

  check_gcs_access(flag_values.workdir, "--workdir")
  for p in flag_values.episodes.split(","):
    check_gcs_access(p, "--episodes")


if __name__ == "__main__":
  # one-line errors for config, checkpoint and path mistakes (exit 2)
  cli.run(main, checks=(_check_paths,))
