"""Tests of empo2_jax/data/: episode records and the TFDS dataset."""
