"""Keep JAX off libtpu on a machine without a TPU, unless JAX_PLATFORMS says otherwise.

    import empo2_jax   # calls cpu_unless_accelerator() before anything imports jax

With libtpu installed (the dev install pins it for launch/aot.py) and JAX_PLATFORMS unset, JAX
tries the TPU backend first; on a machine without a TPU libtpu then prints its start-up errors
(TPU_WORKER_HOSTNAMES, host bounds) to stderr before JAX falls back to the CPU, so every launch
script's one-line error came out as six lines. When this machine has no TPU chip on its PCI bus
(the check JAX itself makes) and no GPU device node, JAX_PLATFORMS is set to "cpu": the same
backend JAX would end up with, without libtpu's lines. A TPU VM or a GPU machine is left alone, as
is a JAX_PLATFORMS the user set (also to ""), and a process that imported jax already.
"""

from __future__ import annotations

import glob
import os

GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of Google's TPU chips (v3, v4, v5p, v5e, v6e, TPU7x and one unnamed; jax's
# hardware_utils lists the same), and the PCI class of processing accelerators for later ones.
# Google's other PCI devices (gVNIC, the network card of GCE VMs: class 0x02) are not TPUs.
TPU_DEVICE_IDS = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})
ACCELERATOR_CLASS = "0x12"
GPU_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ""


def tpu_chips(pci_devices: str = "/sys/bus/pci/devices") -> int:
  """TPU chips on this machine's PCI bus."""
  count = 0
  for device in glob.glob(os.path.join(pci_devices, "*")):
    if _read(os.path.join(device, "vendor")) != GOOGLE_PCI_VENDOR:
      continue
    device_id = _read(os.path.join(device, "device"))
    if device_id in TPU_DEVICE_IDS or _read(os.path.join(device, "class")).startswith(
      ACCELERATOR_CLASS
    ):
      count += 1
  return count


def cpu_unless_accelerator(
  environ=os.environ,
  pci_devices: str = "/sys/bus/pci/devices",
  gpu_nodes: tuple[str, ...] = GPU_DEVICE_NODES,
) -> bool:
  """Set JAX_PLATFORMS=cpu where there is no TPU and no GPU (see the module docstring); True
  when it did. Call it before jax is imported: JAX reads JAX_PLATFORMS when it loads."""
  if "JAX_PLATFORMS" in environ:
    return False
  if tpu_chips(pci_devices) or any(os.path.exists(node) for node in gpu_nodes):
    return False
  environ["JAX_PLATFORMS"] = "cpu"
  return True
