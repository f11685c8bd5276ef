"""A method registered from one file (tests/helpers/toy_method.py) reaches every place a method
must:
the config (its section, its overrides, a typo naming the valid keys), check_config, the
trainer's hooks, and a training iteration's metrics and batch."""

import pytest

from tests.helpers import toy_method  # noqa: F401  (registers toy_bonus)

from configs import frozenlake
from empo2_jax import config_keys, methods
from empo2_jax.train import build


def _config(**over):
  c = frozenlake.get_config("tiny")  # built after the registration: it has the toy's section
  methods.apply(c, "toy_bonus")
  for k, v in over.items():
    node, key = config_keys.lookup(c, k)
    node[key] = v
  return c


def test_toy_method_registers_its_section_checks_and_hooks():
  assert "toy_bonus" in methods.names() and methods.get("toy_bonus").trains
  c = _config()
  assert c.toy_bonus.enabled is True and c.toy_bonus.bonus == 0.5 and c.empo2.p_memory == 0.0
  build.check_config(c)
  with pytest.raises(build.ConfigError, match="toy_bonus.bonus=-1.0: must be >= 0"):
    build.check_config(_config(**{"toy_bonus.bonus": -1.0}))
  with pytest.raises(KeyError, match="valid keys: bonus, enabled"):
    _config(**{"toy_bonus.bonus_": 1.0})
  hooks = methods.Hooks(c)
  assert [p.name for p in hooks.plugins] == ["toy_bonus"]
  assert [p.name for p in methods.Hooks(frozenlake.get_config("tiny")).plugins] == []


@pytest.mark.slow
def test_toy_method_trains_with_its_bonus(tmp_path):
  """One tiny FrozenLake iteration: the hook ran on every turn and the bonus is in the rewards
  the update trained on (intrinsic_mean counts it)."""
  from empo2_jax.train.trainer import Trainer

  c = _config(**{"toy_bonus.bonus": 2.0, "train.iterations": 1})
  trainer = Trainer(c, str(tmp_path), progress=False)
  (m,) = trainer.run()
  assert m["toy_bonus/turns"] > 0
  assert m["intrinsic_mean"] == pytest.approx(2.0)
