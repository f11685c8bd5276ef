"""The release's behaviour as config switches: defaults, clear errors, and the wiring into the
parts that implement them (fast; no environments or models started)."""

import os

import pytest

from empo2_jax.train import build
from empo2_jax.train.build import ConfigError, check_config
from configs import sciworld

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cpu(**overrides):
  c = sciworld.get_config("cpu")
  c.unlock()
  for path, value in overrides.items():
    section, field = path.split(".")
    c[section][field] = value
  c.lock()
  return c


def test_defaults_are_the_authors_and_valid():
  c = sciworld.get_config()
  assert (c.empo2.memory_key, c.empo2.memory_key_text) == ("step", "chat")
  assert c.env.action_correction == "always" and c.optim.prompt_len_check == "both"
  assert c.empo2.tip_chat == "paper" and c.optim.layout == "turn"
  check_config(_cpu())
  # the release's behaviour and our alternatives are valid combinations
  check_config(
    _cpu(
      **{
        "empo2.memory_key": "final",
        "empo2.memory_key_text": "chat",
        "empo2.tip_chat": "release",
        "optim.prompt_len_check": "tip_free",
      }
    )
  )
  check_config(
    _cpu(
      **{
        "empo2.memory_key_text": "recent",
        "empo2.tip_chat": "outcome",
        "env.action_correction": "on_reject",
        "memory.unseen_fallback": "none",
      }
    )
  )


@pytest.mark.parametrize(
  "path,value,message",
  [
    (
      "empo2.memory_key",
      "release",
      "memory_key='release'.*memory_key=final with memory_key_text=chat",
    ),
    ("empo2.memory_key_text", "full", "memory_key_text='full'; valid: recent, chat"),
    ("env.action_correction", "never", "action_correction='never'; valid: on_reject, always"),
    ("optim.prompt_len_check", "tips", "prompt_len_check='tips'; valid: both, sampled, tip_free"),
    ("empo2.tip_chat", "ours", "tip_chat='ours'; valid: paper, release, outcome"),
    ("memory.unseen_fallback", "all", "unseen_fallback='all'; valid: task"),
  ],
)
def test_bad_switch_values_fail_clearly(path, value, message):
  with pytest.raises(ConfigError, match=message):
    check_config(_cpu(**{path: value}))


def test_action_correction_reaches_the_env_config():
  on_reject = _cpu(**{"env.action_correction": "on_reject"})
  assert build.env_config(on_reject).action_correction == "on_reject"
  assert build.env_config(_cpu()).action_correction == "always"
