"""empo2_jax.envs: ScienceWorld episodes for the agent (SPEC §7).

Import the submodules directly (`empo2_jax.envs.scienceworld`, `.pool`, `.fewshot`, `.actions`,
`.base`); this package does not import them eagerly, so nothing starts a JVM or loads py4j on
`import empo2_jax.envs`.
"""
