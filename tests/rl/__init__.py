"""Tests of empo2_jax/rl/: advantages, losses, batches, packing, mini-batches, the update."""
