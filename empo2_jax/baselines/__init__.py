"""Baselines of the paper's tables that are not EMPO2 training runs: Reflexion (verbal reflections
in context, no weight updates) and Retrospex (an offline IQL critic re-scoring the LLM's actions).
GRPO and GiGPO are training methods (empo2_jax/methods/)."""
