"""What every weight loader shares (hf.py for Hugging Face directories, gguf.py for llama.cpp
files): the numpy dtypes params may be stored in, and the check that a load filled every slot.

The import graph of the model package stays acyclic: hf.py and gguf.py both import this module,
and gguf.py never imports hf.py (hf.py hands .gguf paths to gguf.py).
"""

from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from empo2_jax.model.configs import LlamaConfig
from empo2_jax.model.llama import param_shapes
from empo2_jax.model.safetensors_io import FIX, CheckpointError

NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def check_dtype(dtype: str) -> None:
  """ValueError unless `dtype` names one of NP_DTYPES."""
  if dtype not in NP_DTYPES:
    raise ValueError(f"dtype={dtype!r}; valid: {sorted(NP_DTYPES)}")


def check_complete(
  path: str, config: LlamaConfig, seen: set, kind: str, name: Callable[[str], str] = str
) -> None:
  """Raise CheckpointError naming the tensors (`name(slot)` of our `name` or `name.layer`
  slots) a load did not fill."""
  shapes = param_shapes(config)
  expected = {"embed", "final_norm"} | {
    f"{k}.{i}" for k in shapes["layers"] for i in range(config.num_layers)
  }
  if not config.tie_word_embeddings:
    expected.add("lm_head")
  missing = [name(s) for s in sorted(expected - seen)]
  if missing:
    raise CheckpointError(
      f"{path}: {kind} lacks tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}; {FIX}"
    )
