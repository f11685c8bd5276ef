"""empo2_jax: EMPO2 (memory-augmented hybrid on/off-policy RL for LLM agents) in JAX."""

import sys as _sys

from empo2_jax import platforms as _platforms

__version__ = "0.1.0"

if "jax" not in _sys.modules:  # JAX reads JAX_PLATFORMS when it loads
  _platforms.cpu_unless_accelerator()  # no libtpu start-up lines where there is no TPU
