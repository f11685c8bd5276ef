"""empo2_jax.memory"""
