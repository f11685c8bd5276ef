"""Device mesh over the axes (data, fsdp, tensor) and multi-host start-up.

Axis roles (see sharding.py): `data` replicates params and splits the batch; `fsdp` splits the
batch and shards params/optimizer state; `tensor` shards heads, MLP hidden and vocab.
A mesh is written as a dict or as the flag string "data=1,fsdp=-1,tensor=1"; one axis may be -1
to take the devices the others leave.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Union

import numpy as np

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

AXES = ("data", "fsdp", "tensor")
MeshSpec = Union[str, Mapping[str, int], Sequence[int]]


def parse_mesh_spec(spec: MeshSpec) -> dict[str, int]:
  """ "data=1,fsdp=-1,tensor=1" | {"fsdp": -1} | (1, -1, 1) -> {"data": 1, "fsdp": -1, "tensor": 1}.

  Axes left out of a string or dict get size 1.
  """
  if isinstance(spec, str):
    items = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
      if "=" not in part:
        raise ValueError(
          f"mesh spec part {part!r} is not axis=size; e.g. 'data=1,fsdp=-1,tensor=1'"
        )
      name, size = part.split("=", 1)
      try:
        items[name.strip()] = int(size)
      except ValueError:
        raise ValueError(f"mesh axis {name!r} has size {size!r}, not an integer") from None
    spec = items
  if isinstance(spec, Mapping):
    bad = sorted(set(spec) - set(AXES))
    if bad:
      raise ValueError(f"unknown mesh axes {bad}; valid axes: {AXES}")
    axes = {a: int(spec.get(a, 1)) for a in AXES}
  else:
    sizes = tuple(int(s) for s in spec)
    if len(sizes) != len(AXES):
      raise ValueError(f"mesh shape {sizes} needs {len(AXES)} sizes for axes {AXES}")
    axes = dict(zip(AXES, sizes))
  for name, size in axes.items():
    if size == 0 or size < -1:
      raise ValueError(f"mesh axis {name}={size}; sizes are positive, or -1 for 'the rest'")
  if sum(s == -1 for s in axes.values()) > 1:
    raise ValueError(f"mesh {axes}: at most one axis may be -1")
  return axes


def resolve_mesh_shape(spec: MeshSpec, num_devices: int) -> dict[str, int]:
  """Fill in the -1 axis and check that the mesh uses exactly `num_devices` devices."""
  axes = parse_mesh_spec(spec)
  fixed = math.prod(s for s in axes.values() if s != -1)
  if -1 in axes.values():
    if num_devices % fixed:
      raise ValueError(
        f"mesh {axes}: the fixed axes multiply to {fixed}, which does not divide "
        f"the {num_devices} devices; pick sizes whose product divides {num_devices}"
      )
    axes = {a: (num_devices // fixed if s == -1 else s) for a, s in axes.items()}
  elif fixed != num_devices:
    raise ValueError(
      f"mesh {axes} uses {fixed} devices but there are {num_devices}; make the "
      f"product equal {num_devices} or set one axis to -1"
    )
  return axes


def make_mesh(
  spec: MeshSpec = "data=1,fsdp=-1,tensor=1", devices: Optional[Sequence[jax.Device]] = None
) -> Mesh:
  """A `jax.sharding.Mesh` with Auto axes (data, fsdp, tensor) over `devices` (default: all).

  Device order follows the physical topology on TPU (mesh_utils); `devices` may also be the
  devices of an AOT topology description (no hardware needed).
  """
  devices = list(jax.devices() if devices is None else devices)
  axes = resolve_mesh_shape(spec, len(devices))
  shape = tuple(axes[a] for a in AXES)
  grid = None
  if devices[0].platform == "tpu":
    try:
      grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    except AssertionError:  # e.g. v4 compiled without megacore: two devices per chip
      grid = None
  if grid is None:
    # Keep each process's devices contiguous so a host's batch slice is local to it.
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    grid = np.array(ordered, dtype=object).reshape(shape)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def initialize_distributed(
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
  local_device_ids: Optional[Sequence[int]] = None,
) -> None:
  """Start multi-host JAX. Call before any other JAX call in the process.

  On TPU VMs call it with no arguments (the cluster is detected). For a local multi-process run
  (e.g. two CPU processes) pass all of coordinator_address ("localhost:PORT"), num_processes and
  process_id.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(x is not None for x in explicit) and any(x is None for x in explicit):
    raise ValueError(
      "explicit multi-process start needs all of coordinator_address, "
      f"num_processes and process_id; got {explicit}"
    )
  if num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} must be in [0, {num_processes})")
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    local_device_ids=local_device_ids,
  )
