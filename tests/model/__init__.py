"""Tests of empo2_jax/model/: forward pass, weights I/O, tokenizers, encoder."""
