"""Tests of empo2_jax/memory/: the store, the index, reflection text, rule tips, multi-host sync."""
