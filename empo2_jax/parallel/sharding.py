"""Partition rules: (regex on a param's path, PartitionSpec), first match wins.

Paths are the pytree keys joined by "/" ("layers/wq", "embed"); a rule matches a path's suffix,
so the optimizer state (AdamW mu/nu mirror the params: "opt_state/1/0/mu/layers/wq") follows its
params with the same rules. Every matrix puts `fsdp` on its large (model-width) dimension and
`tensor` on heads / MLP hidden / vocab; the leading stacked-layer axis of layers/* is never
sharded. A dimension that its mesh axes do not divide raises an error naming the param — never a
silent fallback to replication.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Sequence

import numpy as np

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

Rules = Sequence[tuple[str, P]]

# Qwen2 params (shapes in model/llama.py). L = stacked layers, D = width, F = MLP hidden.
LLAMA_RULES: Rules = (
  (r"embed", P("tensor", "fsdp")),  # [V, D]
  (r"lm_head", P("fsdp", "tensor")),  # [D, V]
  (r"layers/w[qkv]", P(None, "fsdp", "tensor")),  # [L, D, heads*hd]
  (r"layers/b[qkv]", P(None, "tensor")),  # [L, heads*hd]
  (r"layers/wo", P(None, "tensor", "fsdp")),  # [L, H*hd, D]
  (r"layers/w_(gate|up)", P(None, "fsdp", "tensor")),  # [L, D, F]
  (r"layers/w_down", P(None, "tensor", "fsdp")),  # [L, F, D]
  (r"\w*norm", P()),  # [L, D] / [D]: small, replicated
  # LoRA adapters (model/lora.py): A [L, in, r] split as its weight's input dim, B [L, r, out] as
  # its output dim; the rank is never split
  (r"layers/(w[qkv]|w_gate|w_up)_lora_a", P(None, "fsdp", None)),
  (r"layers/(w[qkv]|w_gate|w_up)_lora_b", P(None, None, "tensor")),
  (r"layers/(wo|w_down)_lora_a", P(None, "tensor", None)),
  (r"layers/(wo|w_down)_lora_b", P(None, None, "fsdp")),
)

# Batch leading dim over every axis that splits data; the rest replicated.
BATCH_AXES = ("data", "fsdp")


def path_str(path) -> str:
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(k.name)
    else:
      parts.append(str(k))
  return "/".join(parts)


def _is_shape(x) -> bool:
  """A shape tuple as in `llama.param_shapes` (NamedTuples such as optax states are containers)."""
  return type(x) is tuple and len(x) > 0 and all(isinstance(i, int) for i in x)


def _shape(leaf) -> tuple[int, ...]:
  return tuple(leaf) if isinstance(leaf, tuple) else tuple(np.shape(leaf))


def spec_for(path: str, shape: tuple[int, ...], rules: Rules = LLAMA_RULES) -> P:
  """The PartitionSpec for one leaf. Scalars (e.g. optimizer step counts) are replicated."""
  if len(shape) == 0:
    return P()
  for pattern, spec in rules:
    if re.search(rf"(^|/)(?:{pattern})$", path):
      if len(spec) > len(shape):
        raise ValueError(
          f"rule {pattern!r} -> {spec} has {len(spec)} dims but param {path!r} has shape {shape}"
        )
      return spec
  raise ValueError(
    f"no partition rule matches param {path!r} (shape {shape}); add a "
    f"(regex, PartitionSpec) rule for it"
  )


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  names = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(mesh.shape[a] for a in names)


def check_divisible(path: str, shape: tuple[int, ...], spec: P, mesh: Mesh) -> None:
  for dim, (size, axes) in enumerate(zip(shape, spec)):
    n = _axis_size(mesh, axes)
    if size % n:
      raise ValueError(
        f"cannot shard param {path!r}: dim {dim} has size {size}, not divisible "
        f"by mesh axes {axes} of size {n} (shape {shape}, spec {spec}, mesh "
        f"{dict(mesh.shape)}); choose a mesh whose {axes} size divides {size}"
      )


def tree_specs(tree: Any, rules: Rules = LLAMA_RULES) -> Any:
  """PartitionSpec for every leaf (arrays, ShapeDtypeStructs or shape tuples)."""
  is_leaf = _is_shape
  return jax.tree_util.tree_map_with_path(
    lambda p, x: spec_for(path_str(p), _shape(x), rules), tree, is_leaf=is_leaf
  )


def tree_shardings(tree: Any, mesh: Mesh, rules: Rules = LLAMA_RULES) -> Any:
  """NamedSharding for every leaf, after checking each sharded dim divides evenly."""
  is_leaf = _is_shape

  def one(p, x):
    name, shape = path_str(p), _shape(x)
    spec = spec_for(name, shape, rules)
    check_divisible(name, shape, spec, mesh)
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_leaf)


def abstract_on_mesh(tree: Any, mesh: Mesh, rules: Rules = LLAMA_RULES) -> Any:
  """ShapeDtypeStructs carrying their mesh sharding: for AOT lowering without allocating."""
  shardings = tree_shardings(tree, mesh, rules)
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings
  )


def _put(x, sharding: NamedSharding) -> jax.Array:
  """Place a host value that every process holds in full (works across hosts)."""
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard_tree(tree: Any, mesh: Mesh, rules: Rules = LLAMA_RULES) -> Any:
  """Place a params (or optimizer state) pytree on `mesh` by the rules."""
  return jax.tree.map(_put, tree, tree_shardings(tree, mesh, rules))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (row) dim over (data, fsdp); trailing dims replicated. Fits arrays of any rank."""
  return NamedSharding(mesh, P(BATCH_AXES))


def _check_batch(name: str, shape, mesh: Mesh) -> None:
  n = _axis_size(mesh, BATCH_AXES)
  if not shape or shape[0] % n:
    raise ValueError(
      f"batch field {name!r} shape {tuple(shape)}: leading dim must be divisible by data*fsdp = {n}"
    )


def shard_batch(batch: Any, mesh: Mesh) -> Any:
  """Place a global batch that every process holds in full."""

  def one(p, x):
    _check_batch(path_str(p), np.shape(x), mesh)
    return _put(x, batch_sharding(mesh))

  return jax.tree_util.tree_map_with_path(one, batch)


def batch_from_process_local(local_batch: Any, mesh: Mesh) -> Any:
  """Assemble the global batch from each process's own rows (its slice of episodes).

  Rows are concatenated in process order; needs the mesh's devices ordered by process, as
  `make_mesh` does.
  """

  def one(x):
    global_shape = (np.shape(x)[0] * jax.process_count(),) + np.shape(x)[1:]
    sharding = batch_sharding(mesh)
    _check_batch("local batch", global_shape, mesh)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x), global_shape)

  return jax.tree.map(one, local_batch)


def shard_activation(x: jax.Array, *spec) -> jax.Array:
  """Pin activation `x` to `spec` (mesh axis names per dim) on the ambient mesh, the one that
  `on_mesh` sets while a builder's function is traced; axes that mesh lacks are dropped, and
  without one (a single device, the tests' plain calls) `x` is returned as is.

  Why the model pins its layer activations: the weights are split over `fsdp` on the model width
  D and the rows over (data, fsdp). Left alone, XLA's propagation may contract
  `h [B, T, D] @ w [D, F]` over the split D, gathering every row's activations to every chip and
  all-reducing [B, T, F] partial sums (1.4 GB per matmul for a micro-batch of eight 4532-token
  rows of the 7B model) instead of gathering the weights (0.14 GB). With the rows pinned, the
  weights move, as FSDP intends."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  names = set(mesh.axis_names)

  def keep(axes):
    axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ()) if a in names)
    return axes or None

  return jax.lax.with_sharding_constraint(x, P(*(keep(a) for a in spec)))


def on_mesh(fn, mesh: Mesh):
  """`fn` traced with `mesh` as the ambient mesh, so `shard_activation` constraints apply."""

  @functools.wraps(fn)
  def traced(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return traced


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
