"""Tests of empo2_jax/methods/: the method registry and each plug-in."""
