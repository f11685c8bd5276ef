"""The tiny Llama the kernel tests run on: 2 layers, grouped-query attention (4 heads over 2 KV
heads), a 512-token vocabulary; small enough that a forward and a gradient take milliseconds."""

from empo2_jax.model.configs import LlamaConfig

TINY = LlamaConfig(
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
)
