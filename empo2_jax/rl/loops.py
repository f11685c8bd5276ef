"""Loop helpers of the jitted update (rl/update_steps.py, rl/update_grads.py): loops over the
leading axis that skip the entries holding nothing, and the running sum of their metrics. Each is
a pure function of jax arrays.

    nonempty_loop(keep, body, carry)    body over the kept indices only (dynamic trip count)
    map_nonempty(f, xs, keep)           f on the kept leading slices, zeros elsewhere
    combine_metrics(total, met)         sums, a max for *_max
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def any_after_first(x):
  """Whether each leading entry holds anything.

  Args:
    x: [N, ...].
  Returns:
    [N] bool: any nonzero entry beyond the leading axis.
  """
  return jnp.any(x != 0, axis=tuple(range(1, x.ndim)))


def index_tree(tree, i):
  """Entry i of the leading axis of every leaf ([N, ...] -> [...])."""
  return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), tree)


def nonempty_loop(keep, body, carry):
  """carry = body(j, carry) for the indices j with keep[j], in order.

  Args:
    keep: [N] bool.
    body: (j int32 scalar, carry) -> carry.
    carry: the initial carry.
  Returns:
    The final carry; the loop's trip count is the number of kept indices (a while loop).
  """
  order = jnp.argsort(jnp.where(keep, 0, 1), stable=True)  # kept indices first, in order
  return jax.lax.fori_loop(
    0, jnp.sum(keep.astype(jnp.int32)), lambda i, c: body(order[i], c), carry
  )


def map_nonempty(f, xs, keep):
  """f over the kept leading slices.

  Args:
    f: one slice of xs -> an array of a fixed shape S.
    xs: a tree of [N, ...] leaves.
    keep: [N] bool.
  Returns:
    [N, *S]: f(slice j) where keep[j], zeros elsewhere; f runs on the kept slices only.
  """
  out_shape = jax.eval_shape(f, index_tree(xs, 0))
  out = jnp.zeros((keep.shape[0],) + out_shape.shape, out_shape.dtype)
  return nonempty_loop(
    keep, lambda j, o: jax.lax.dynamic_update_index_in_dim(o, f(index_tree(xs, j)), j, 0), out
  )


def combine_metrics(total, met):
  """The running combination of per-step (or per-micro-batch) metrics: sums, and a max for the
  keys ending in _max (ratio_max, _diff_max). Both dicts have the same keys and shapes."""
  return {
    k: (jnp.maximum(total[k], v) if k.endswith("_max") else total[k] + v) for k, v in met.items()
  }


def constrain(tree, batch_sharding=None):
  """Every leaf of `tree` (one micro-batch: leaves [mb, ...]) constrained to `batch_sharding`
  (rows spread over the devices), or `tree` unchanged when batch_sharding is None."""
  if batch_sharding is None:
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding), tree)
