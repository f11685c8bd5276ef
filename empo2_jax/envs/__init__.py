"""empo2_jax.envs"""
