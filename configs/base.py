"""The base EMPO2 config as a config file (`--config=configs/base.py`); its fields and their
meaning live in empo2_jax/defaults.py, which configs/sciworld.py builds on."""

from empo2_jax.defaults import get_config

__all__ = ["get_config"]
