"""Tests of empo2_jax/sampling/: the sampler and its sessions."""
