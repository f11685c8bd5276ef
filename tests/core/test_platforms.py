"""Without a TPU, JAX stays off libtpu unless JAX_PLATFORMS says otherwise (empo2_jax/platforms.py):
the chip count from a PCI tree, the decision, and a launch script's error on this CPU machine as
one line with JAX_PLATFORMS unset."""

import os
import subprocess
import sys

import pytest

from empo2_jax import platforms
from empo2_jax.train.workdir_lock import WorkdirLock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pci(tmp_path, devices):
  """A /sys/bus/pci/devices-like tree: (vendor, device, class) per device."""
  root = tmp_path / "pci"
  for i, (vendor, device, cls) in enumerate(devices):
    d = root / f"0000:00:{i:02x}.0"
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(device + "\n")
    (d / "class").write_text(cls + "\n")
  root.mkdir(exist_ok=True)
  return str(root)


GVNIC = ("0x1ae0", "0x0042", "0x020000")  # Google's virtual NIC: not a TPU
VIRTIO = ("0x1af4", "0x1000", "0x020000")
V5P = ("0x1ae0", "0x0062", "0x120000")
LATER_TPU = ("0x1ae0", "0x0099", "0x120000")  # an id not in the list, accelerator class


def test_tpu_chips_counts_google_accelerators_only(tmp_path):
  assert platforms.tpu_chips(_pci(tmp_path / "a", [GVNIC, VIRTIO])) == 0
  assert platforms.tpu_chips(_pci(tmp_path / "b", [GVNIC, V5P, V5P, V5P, V5P])) == 4
  assert platforms.tpu_chips(_pci(tmp_path / "c", [LATER_TPU])) == 1
  assert platforms.tpu_chips(str(tmp_path / "no-such-bus")) == 0


def test_cpu_only_where_there_is_no_accelerator_and_no_choice(tmp_path):
  bare, tpu = _pci(tmp_path / "bare", [GVNIC]), _pci(tmp_path / "tpu", [V5P])
  gpu = tmp_path / "nvidia0"
  gpu.write_text("")
  env = {}
  assert platforms.cpu_unless_accelerator(env, bare, ()) and env == {"JAX_PLATFORMS": "cpu"}
  for given in ("", "tpu", "cuda,cpu"):  # the user's choice stands, "" (JAX picks) too
    env = {"JAX_PLATFORMS": given}
    assert not platforms.cpu_unless_accelerator(env, bare, ()) and env["JAX_PLATFORMS"] == given
  env = {}
  assert not platforms.cpu_unless_accelerator(env, tpu, ()) and env == {}
  assert not platforms.cpu_unless_accelerator(env, bare, (str(gpu),)) and env == {}


@pytest.mark.skipif(platforms.tpu_chips() > 0, reason="a TPU machine keeps libtpu")
def test_a_launch_error_is_one_line_without_jax_platforms(tmp_path):
  # A busy workdir is refused after JAX has started its backend (launch/train.py asks for the
  # process index first), so libtpu's start-up lines would come before the error line.
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "EMPO2_DEBUG")}
  with WorkdirLock(str(tmp_path / "run")):
    out = subprocess.run(
      [
        sys.executable,
        os.path.join(ROOT, "launch", "train.py"),
        "--config=configs/sciworld.py:tiny",
        f"--workdir={tmp_path / 'run'}",
      ],
      capture_output=True,
      text=True,
      timeout=300,
      cwd=ROOT,
      env=env,
    )
  lines = out.stderr.strip().splitlines()
  assert out.returncode != 0 and len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith("error: ") and "in use by another run" in lines[0], lines
