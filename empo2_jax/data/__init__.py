"""empo2_jax.data"""
