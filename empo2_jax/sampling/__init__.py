"""empo2_jax.sampling"""
