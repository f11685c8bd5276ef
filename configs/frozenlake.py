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
  # Many maps: each training variation is one seed (SPA draws fresh seeds every step; we walk a
  # permutation of these); 128 test maps (SPA validates on 128 groups).
  c.env.num_train_variations = 256
  c.env.num_test_variations = 128
  c.env.workers = 4  # no JVM: a worker is one light process
  c.env.few_shot = 1  # one solved map of another train seed in the first prompt
  c.rollout.max_context = 2048  # instruction + example + 5 turns: ~0.5-1k tokens
  c.optim.max_prompt_len = c.rollout.max_context - c.rollout.max_new_tokens
  if args.get("cpu") or args.get("tiny"):
    # "Left || Down || Right" is ~8 tokens
    defaults.small_cpu(c, max_new_tokens=16, max_context=1536, iterations=2, eval_every=2)
    c.env.num_train_variations = 4
    c.env.num_test_variations = 4
  if args.get("cpu"):
    defaults.embedded_model(c)
  if args.get("tiny"):
    defaults.tiny_model(c)
  c.lock()
  return c


def get_config(arg=None):
  args = defaults.parse_args("frozenlake", arg, ARGS)
  fields = dict(size=4, p=0.8, slippery=not args.get("deterministic"), map_generator="ragen")
  return puzzle_config("frozenlake", "frozenlake", fields, args)
