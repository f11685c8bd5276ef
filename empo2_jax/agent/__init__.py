"""empo2_jax.agent"""
