"""Mode drawing, configs and the trainer's clear errors (fast; no environments started)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from empo2_jax.train.build import ConfigError, check_config
from empo2_jax.train.iteration import draw_mode
from configs import sciworld

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("p,q", [(0.25, 2 / 3), (0.5, 1 / 3), (0.1, 1.0), (0.0, 0.5)])
def test_mode_frequencies_match_p_and_q(p, q):
  n = 200_000
  u = np.random.default_rng(0).random(n)
  modes = np.array([draw_mode(x, p, q) for x in u])
  expect = {"off": p * q, "on_tips": p * (1 - q), "on": 1 - p}
  for mode, prob in expect.items():
    freq = np.mean(modes == mode)
    sigma = np.sqrt(prob * (1 - prob) / n)
    assert abs(freq - prob) <= 5 * sigma + 1e-12, (mode, freq, prob)


def test_mode_boundaries_follow_spec():
  assert draw_mode(0.16, 0.25, 2 / 3) == "off"
  assert draw_mode(0.17, 0.25, 2 / 3) == "on_tips"
  assert draw_mode(0.249, 0.25, 2 / 3) == "on_tips"
  assert draw_mode(0.25, 0.25, 2 / 3) == "on"
  with pytest.raises(ValueError):
    draw_mode(0.5, 1.5, 0.5)


def test_default_config_is_the_paper_setup():
  c = sciworld.get_config()
  assert c.model.preset == "7b" and c.optim.lr == 1e-6
  assert (c.rollout.variations_per_iter, c.rollout.group_size) == (16, 8)
  assert (c.loss.eps_low, c.loss.eps_high, c.loss.dual_clip) == (0.2, 0.3, 10.0)
  assert c.loss.low_prob_delta == -5.0 and c.memory.threshold == 0.5 and c.memory.top_k == 10
  assert c.train.eval_temperature == 0.4 and c.train.eval_every == 20
  with pytest.raises(ConfigError, match="checkpoint"):
    check_config(c)


def test_unknown_config_key_names_valid_keys():
  c = sciworld.get_config("cpu")
  with pytest.raises(AttributeError, match="p_memory"):
    c.empo2.p_memry = 0.5
  with pytest.raises(ValueError, match="valid"):
    sciworld.get_config("gpux")


def test_learn_wide_changes_only_what_it_says():
  """`learn,wide` (the second learning run, docs/results.md) is `learn` with 100 train
  variations, lr 5e-6, grown update shapes and no in-run evaluation; `wide` alone is refused."""
  base, wide = sciworld.get_config("learn"), sciworld.get_config("learn,wide")
  changed = {
    ("env", "num_train_variations"): (10, 100),
    ("optim", "lr"): (1e-5, 5e-6),
    ("optim", "update_shapes"): ("fit", "grow"),
    ("train", "iterations"): (12, 16),
    ("train", "eval_every"): (3, 0),
    ("train", "eval_at_end"): (True, False),
  }
  for (group, key), (a, b) in changed.items():
    assert (base[group][key], wide[group][key]) == (a, b), (group, key)

  def flat(c):
    return {(g, k): v for g in c if hasattr(c[g], "items") for k, v in c[g].items()}

  diff = {k for k, v in flat(base).items() if flat(wide).get(k) != v}
  assert diff == set(changed)
  with pytest.raises(ValueError, match="learn,wide"):
    sciworld.get_config("wide")


def test_train_cli_errors_fast():
  cmd = [
    sys.executable,
    os.path.join(ROOT, "launch", "train.py"),
    "--config=" + os.path.join(ROOT, "configs", "sciworld.py"),
  ]
  out = subprocess.run(
    cmd + ["--workdir=/tmp/empo2_never"], capture_output=True, text=True, timeout=120
  )
  assert out.returncode != 0 and "config.model.checkpoint" in out.stderr
  out = subprocess.run(
    cmd + ["--config.empo2.p_memry=0.1"], capture_output=True, text=True, timeout=120
  )
  assert out.returncode != 0 and "p_memory" in out.stderr and "p_memry" in out.stderr


def test_default_precision_and_minibatches():
  """fp32 masters + bf16 compute, the paper's 128-sample mini-batches; the update's settings are
  the config's by name, and launch/aot.py defaults to the same values (16 micro-batches of 8)."""
  import dataclasses

  from empo2_jax.train import settings

  c = sciworld.get_config()
  assert (c.model.param_dtype, c.model.compute_dtype) == ("float32", "bfloat16")
  u = settings.update_config(c)
  assert c.optim.minibatch_size == u.minibatch_size == 128
  assert c.optim.lr == u.lr == 1e-6 and c.optim.epochs == u.epochs == 1
  for key in ("lr", "weight_decay", "b1", "b2", "grad_clip", "minibatch_size", "micro_rows"):
    assert getattr(u, key) == c.optim[key], key
  loss = dataclasses.asdict(u.loss)
  terms = dict(loss.pop("terms"))  # the registered loss terms' keys (rl/loss_terms.py)
  assert {**loss, **terms} == c.loss.to_dict()
  b = settings.batch_config(c, 0)
  assert (b.max_prompt_len, b.prompt_len_check, b.micro_rows) == (8160, "both", 8)
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "launch_aot", os.path.join(ROOT, "launch", "aot.py")
  )
  aot_cli = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(aot_cli)
  base = aot_cli.base_config()
  assert (base.model.param_dtype, base.model.compute_dtype, base.model.remat) == (
    c.model.param_dtype,
    c.model.compute_dtype,
    c.model.remat,
  )
  assert aot_cli.default_microbatches(base, "train_step") == 128 // 8 == 16
  assert aot_cli.default_microbatches(base, "lm_train_step") == 16
  assert aot_cli.default_microbatches(base, "forward") == 1


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("model.param_dtype", "bfloat16", "master weights"),
    ("model.param_dtype", "fp32", "valid"),
    ("model.compute_dtype", "bf16", "compute_dtype"),
    ("rollout.cache_dtype", "int8", "cache_dtype"),
    ("optim.minibatch_size", 0, "minibatch_size"),
    ("optim.micro_rows", 0, "micro_rows"),
    ("optim.max_prompt_len", 8000, "max_context"),
    ("env.workers", -1, "one per CPU"),
    ("train.eval_batch", -1, "variations_per_iter x group_size"),
    ("optim.update_shapes", "largest", "valid: grow"),
    (
      "model.lora_targets",
      "q_proj,qkv",
      r"unknown \['qkv'\]; valid: all-linear or .*q_proj,k_proj",
    ),
    ("model.lora_rank", -4, "lora_rank >= 0"),
  ],
)
def test_config_checks_fail_at_once(field, value, match):
  c = sciworld.get_config("cpu")
  check_config(c)  # the cpu variant itself is valid (prompt + response fit)
  assert c.optim.max_prompt_len + c.rollout.max_new_tokens <= c.rollout.max_context
  section, key = field.split(".")
  c[section][key] = value
  with pytest.raises(ConfigError, match=match):
    check_config(c)


def _raised_in(error: BaseException) -> tuple[str, str]:
  """(file under the repository, function) that raised the exception a ConfigError reports."""
  inner = error.__cause__ or error.__context__ or error
  tb = inner.__traceback__
  while tb.tb_next is not None:
    tb = tb.tb_next
  return os.path.relpath(tb.tb_frame.f_code.co_filename, ROOT), tb.tb_frame.f_code.co_name


@pytest.mark.parametrize(
  "field,value,where",
  [
    ("optim.old_logp_source", "cache", ("empo2_jax/rl/update.py", "__post_init__")),
    ("advantage.estimator", "ppo", ("empo2_jax/rl/advantages.py", "get_estimator")),
    ("advantage.episode_stats", "all", ("empo2_jax/rl/advantages.py", "__post_init__")),
    ("rollout.group_size", 1, ("empo2_jax/rl/advantages.py", "__post_init__")),
    ("model.param_dtype", "fp32", ("empo2_jax/model/configs.py", "__post_init__")),
    ("model.compute_dtype", "bf16", ("empo2_jax/model/configs.py", "__post_init__")),
    ("rollout.cache_dtype", "int8", ("empo2_jax/sampling/sampler.py", "__post_init__")),
    ("optim.layout", "rows", ("empo2_jax/rl/batch.py", "__post_init__")),
    ("optim.update_shapes", "largest", ("empo2_jax/rl/batch.py", "__post_init__")),
    ("memory.unseen_fallback", "all", ("empo2_jax/memory/index.py", "__post_init__")),
  ],
)
def test_each_value_is_checked_once_by_its_settings_object(field, value, where):
  """A bad value is refused by the settings object that holds it (and nowhere before it), with
  a message that names the config key."""
  c = sciworld.get_config("cpu")
  section, key = field.split(".")
  c[section][key] = value
  with pytest.raises(ConfigError, match=rf"{field}={value!r}") as info:
    check_config(c)
  assert _raised_in(info.value) == where


@pytest.mark.parametrize(
  "spec, match",
  [
    ("configs/sciworld.py:cpu,fast", r"unknown sciworld config arguments \['fast'\]; valid: cpu, "),
    ("configs/sciworld.py:task", r"'task' needs a value, e\.g\. task=<name>"),
    ("configs/frozenlake.py:cpu,slippy", r"valid: cpu, tiny, coords, deterministic"),
    ("configs/sokoban.py:deterministic", r"unknown sokoban config arguments \['deterministic'\]"),
  ],
)
def test_config_file_argument_typos_name_the_valid_ones(spec, match):
  from empo2_jax.defaults import load_config

  with pytest.raises(ValueError, match=match):
    load_config(spec)


def test_config_file_arguments_parse_flags_and_values():
  from empo2_jax.defaults import load_config, parse_args

  assert parse_args("x", " cpu, task=find-plant ,", ("cpu",), ("task",)) == {
    "cpu": True,
    "task": "find-plant",
  }
  assert parse_args("x", None, ("cpu",)) == {}
  c = load_config("configs/sciworld.py:task=find-plant,cpu")
  assert (c.env.task, c.model.checkpoint, c.optim.minibatch_size) == (
    "find-plant",
    "embedded:smollm2-135m-instruct",
    4,
  )
