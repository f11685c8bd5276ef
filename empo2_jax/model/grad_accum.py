"""A scanned layer stack whose backward adds the layers' gradient into an accumulator in place.

Gradient accumulation over micro-batches keeps a params-sized accumulator and, while a micro-batch's
backward runs, that micro-batch's own params-sized gradient: 2 x params beside the weights (1.0 GiB
of the SmolLM2-135M update's 1.2 GiB of temporaries, bench/host_memory.py; for the 7B program a
params-sized buffer is 7.1 GiB a chip, docs/aot_table.md). Here the backward adds each layer's
gradient into the accumulator's slice for that layer as soon as it is computed (a
dynamic-update-slice on the backward loop's carry, done in place), so only one layer's gradient
exists at a time. The idea is Megatron-LM's gradient-accumulation fusion (weight gradients
written into a persistent main_grad); in JAX it is expressed through the cotangent of the
accumulator:

  y = scan_accumulating(body, x, layers, acc, consts)

computes y = scan of body(h, layer, consts) over the stacked layers (the same value as
jax.lax.scan(jax.checkpoint(body))), and its custom VJP returns
  for x:      the usual cotangent;
  for acc:    acc + the layers' gradient (d<ct, y>/d layers, each layer in float32);
  for layers: nothing (zero) - take the gradient with respect to `acc`, not the layers;
  for consts: nothing (RoPE tables, masks: no gradient flows through them).
Each layer's input is saved and the layer is recomputed in the backward: full remat.

The accumulator's cotangent is affine in the incoming cotangent, not linear; it is correct when
`acc` feeds exactly one such call in the differentiated function (as in rl/update.py: one forward
per micro-batch loss), and the caller differentiates with respect to `acc` (jax.grad sums the
cotangents of an input used twice, which would add `acc` twice).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def scan_accumulating(body: Callable, x: jax.Array, layers: Any, acc: Any, consts: Any):
  """See the module docstring. body(h, layer, consts) -> h, with layer one slice of `layers`."""
  return jax.lax.scan(lambda h, layer: (body(h, layer, consts), None), x, layers)[0]


def _fwd(body, x, layers, acc, consts):
  def step(h, layer):
    return body(h, layer, consts), h  # each layer's input: the residual a full remat keeps

  y, inputs = jax.lax.scan(step, x, layers)
  return y, (inputs, layers, acc, consts)


def _bwd(body, res, ct):
  inputs, layers, acc, consts = res
  n = inputs.shape[0]

  def step(i, carry):
    ct, acc = carry
    j = n - 1 - i  # the last layer first
    layer = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, j, keepdims=False), layers)
    h = jax.lax.dynamic_index_in_dim(inputs, j, keepdims=False)
    _, vjp = jax.vjp(lambda h_, layer_: body(h_, layer_, consts), h, layer)
    ct, grads = vjp(ct)

    def add(a, g):
      row = jax.lax.dynamic_index_in_dim(a, j, keepdims=False) + g.astype(a.dtype)
      return jax.lax.dynamic_update_index_in_dim(a, row, j, 0)

    return ct, jax.tree.map(add, acc, grads)

  ct, acc = jax.lax.fori_loop(0, n, step, (ct, acc))
  return ct, None, acc, None


scan_accumulating.defvjp(_fwd, _bwd)
