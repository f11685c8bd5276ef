"""One TPU compiler: the libtpu the dev install compiles with (launch/aot.py, the AOT table) is the
one `pip install ".[tpu]"` puts on a TPU VM with the pinned jax."""

import importlib.metadata
import pathlib
import re
import tomllib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _libtpu(requirements):
  found = [Requirement(r) for r in requirements if re.match(r"libtpu\b", r)]
  assert len(found) == 1, requirements
  return found[0]


def test_dev_and_tpu_extras_pin_the_libtpu_jax_tpu_resolves():
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  lock = (ROOT / "requirements-dev.txt").read_text().splitlines()
  pins = {
    "tpu extra": _libtpu(extras["tpu"]),
    "dev extra": _libtpu(extras["dev"]),
    "requirements-dev.txt": _libtpu([x for x in lock if not x.startswith("#")]),
  }
  versions = {where: str(r.specifier) for where, r in pins.items()}
  assert len(set(versions.values())) == 1 and all(v.startswith("==") for v in versions.values())
  version = versions["tpu extra"][2:]
  # jax's own tpu extra (the installed jax's metadata) must accept that libtpu, so pip resolves
  # `.[tpu]` to it; the dev install and a TPU VM then run one compiler
  jax_tpu = [
    Requirement(r)
    for r in importlib.metadata.requires("jax")
    if r.startswith("libtpu") and 'extra == "tpu"' in r
  ]
  assert jax_tpu and all(version in r.specifier for r in jax_tpu), (version, jax_tpu)
  lock_jax = [
    x for x in (ROOT / "requirements.txt").read_text().splitlines() if x.startswith("jax==")
  ]
  assert lock_jax == [f"jax=={importlib.metadata.version('jax')}"]
