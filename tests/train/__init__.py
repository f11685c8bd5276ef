"""Tests of empo2_jax/train/: the trainer's parts (checkpoints, evaluation, metrics, SFT, probe)."""
