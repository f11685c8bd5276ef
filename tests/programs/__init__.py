"""Tests of empo2_jax/programs/: the AOT programs."""
