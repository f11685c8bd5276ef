"""Tests of empo2_jax/baselines/: Reflexion, Retrospex and the adaptation loop."""
