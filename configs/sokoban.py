"""EMPO2 (or any method) on Sokoban, as SPA/RAGEN run SimpleSokoban (empo2_jax/envs/sokoban.py).

configs/sokoban.py              6x6 rooms with one box, RAGEN's limits (5 turns, 5 actions a turn,
                                10 in all); needs --config.model.checkpoint=DIR
configs/sokoban.py:cpu          the embedded SmolLM2-135M-Instruct, small batch, 2 iterations
configs/sokoban.py:tiny         a random-init tiny model (tests: mechanics only)
configs/sokoban.py:cpu,coords   SPA's text_with_coordinates rendering
"""

import os

from empo2_jax import defaults

# the sibling file by its path, so this config loads from any working directory
puzzle_config = defaults.load_module(
  os.path.join(os.path.dirname(os.path.abspath(__file__)), "frozenlake.py")
).puzzle_config

ARGS = ("cpu", "tiny", "coords")


def get_config(arg=None):
  args = defaults.parse_args("sokoban", arg, ARGS)
  fields = dict(dim=(6, 6), num_boxes=1, search_depth=300, num_gen_steps=0, max_env_steps=100)
  return puzzle_config("sokoban", "sokoban", fields, args)
