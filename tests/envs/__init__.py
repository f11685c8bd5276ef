"""Tests of empo2_jax/envs/: ScienceWorld, WebShop, FrozenLake, Sokoban, the pool and the
registry."""
