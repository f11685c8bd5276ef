"""empo2_jax.envs: the agent's environments behind one registry (`registry.get_suite(name)`):
ScienceWorld (docs/method.md §7), FrozenLake and Sokoban (docs/methods.md §7.5), and those
registered later.

Import the submodules directly (`empo2_jax.envs.registry`, `.scienceworld.env` and the rest of the
ScienceWorld package (`.jvm`, `.prompts`, `.suite`), `.pool`, `.fewshot`, `.actions`, `.base`,
`.puzzles`, `.puzzle_suite`, `.frozenlake`, `.sokoban`, `.webshop`); this package does not
import them eagerly, so nothing starts a JVM or loads py4j on `import empo2_jax.envs`.
"""
