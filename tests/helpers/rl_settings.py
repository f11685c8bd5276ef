"""The update's settings at the base config's values (empo2_jax/defaults.py, built by
train/settings.py), with a test's overrides: the settings dataclasses have no defaults of their
own for what the config holds."""

import dataclasses

from empo2_jax.defaults import get_config
from empo2_jax.rl.batch import BatchConfig
from empo2_jax.rl.losses import LossConfig
from empo2_jax.rl.update import UpdateConfig
from empo2_jax.train import settings

QWEN_PAD_ID = 151643  # <|endoftext|>


def loss_config(**overrides) -> LossConfig:
  return dataclasses.replace(settings.loss_config(get_config()), **overrides)


def update_config(**overrides) -> UpdateConfig:
  return dataclasses.replace(settings.update_config(get_config()), **overrides)


def batch_config(**overrides) -> BatchConfig:
  return dataclasses.replace(settings.batch_config(get_config(), QWEN_PAD_ID), **overrides)
