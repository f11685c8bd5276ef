"""empo2_jax.sampling: batched KV-cache generation (sampler.generate) and multi-turn sessions."""

from empo2_jax.sampling.sampler import Engine, SamplerSettings, generate, get_engine
from empo2_jax.sampling.session import Session

__all__ = ["Engine", "SamplerSettings", "Session", "generate", "get_engine"]
