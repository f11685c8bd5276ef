"""empo2_jax.train"""
