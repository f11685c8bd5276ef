"""Shared fixtures: tiny random Hugging Face Qwen2 checkpoints written with transformers.

One JAX persistent compilation cache per test run (empo2_jax/compile_cache.py): a temporary
directory made when pytest loads this file (in the controller, before xdist starts its workers,
which inherit it with the environment, as do the launch scripts the tests start: their "auto"
setting reads $JAX_COMPILATION_CACHE_DIR), removed when the run ends. A test process then compiles
a program another one already compiled (same shapes and flags) from the cache, and the user's own
cache is left alone. Set JAX_COMPILATION_CACHE_DIR yourself to keep one across runs.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="empo2_jax_test_cache_")
  os.environ["EMPO2_TEST_CACHE_OWNED"] = os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_sessionfinish(session):
  """The controller (not an xdist worker) removes the run's cache if this file made it."""
  owned = os.environ.get("EMPO2_TEST_CACHE_OWNED")
  if owned and not hasattr(session.config, "workerinput"):
    shutil.rmtree(owned, ignore_errors=True)


def make_hf_checkpoint(
  path,
  *,
  vocab=512,
  hidden=64,
  inter=96,
  layers=2,
  heads=4,
  kv_heads=2,
  head_dim=None,
  tie=False,
  theta=10000.0,
  seed=0,
):
  """Save a random-init transformers Qwen2ForCausalLM (fp32) to `path`; returns the torch model."""
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM

  torch.manual_seed(seed)
  cfg = Qwen2Config(
    vocab_size=vocab,
    hidden_size=hidden,
    intermediate_size=inter,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    rope_theta=theta,
    tie_word_embeddings=tie,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    head_dim=head_dim or hidden // heads,
  )
  model = Qwen2ForCausalLM(cfg).eval()
  with torch.no_grad():  # random biases and norms so those paths are exercised
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path, safe_serialization=True)
  return model


@pytest.fixture(scope="session")
def hf_tiny(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("hf_tiny"))
  model = make_hf_checkpoint(path)
  return path, model


def random_batch(rng, batch, length, vocab, left_pad=(), right_pad=()):
  tokens = rng.integers(0, vocab, size=(batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  for row, n in left_pad:
    mask[row, :n] = 0
    tokens[row, :n] = 0
  for row, n in right_pad:
    mask[row, length - n :] = 0
    tokens[row, length - n :] = 0
  return tokens, mask


def hf_logits(model, tokens, mask):
  """transformers logits [B, T, V] (fp32 numpy) with positions counted over real tokens only, as
  our forward counts them (left padding gets position 0)."""
  import torch

  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(tokens, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      position_ids=torch.tensor(pos, dtype=torch.long),
    )
  return out.logits.float().numpy()
