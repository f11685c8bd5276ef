"""empo2_jax.rl"""
