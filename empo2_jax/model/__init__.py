"""empo2_jax.model"""
