"""empo2_jax.parallel"""
