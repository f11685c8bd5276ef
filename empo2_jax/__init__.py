"""empo2_jax: EMPO2 (memory-augmented hybrid on/off-policy RL for LLM agents) in JAX."""

__version__ = "0.1.0"
