"""Tolerances for comparing two float computations of the same sums (two layouts, two kernels, two
libraries), scaled to the values compared instead of a bare atol=1e-5.

Summing n terms in floating point in different orders moves the result by about
eps(dtype) * sqrt(n) times the size of the terms (random-walk rounding; the worst case grows with
n). The size of the terms is bounded by the largest magnitude among the values compared, so an
element near zero that is the difference of large terms is held to the array's scale, not its own.
"""

import math

import numpy as np


def sum_rtol(dtype, n_terms: int, c: float = 8.0) -> float:
  """c * eps(dtype) * sqrt(n_terms): the relative difference two summation orders of n_terms
  terms may show (c covers the products and exp/log around the sums)."""
  return c * float(np.finfo(np.dtype(dtype)).eps) * math.sqrt(max(int(n_terms), 1))


def assert_sums_close(
  actual, desired, *, n_terms: int, dtype=np.float32, c: float = 8.0, err_msg=""
):
  """assert_allclose with rtol = sum_rtol(dtype, n_terms, c) and atol = rtol * max|desired|."""
  actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
  rtol = sum_rtol(dtype, n_terms, c)
  scale = float(np.max(np.abs(desired))) if desired.size else 0.0
  np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rtol * scale, err_msg=err_msg)
