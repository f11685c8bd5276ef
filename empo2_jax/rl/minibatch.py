"""An iteration's turn samples -> the shuffled mini-batch row layout of the jitted update.

    batch, stats = build_batch(turns, advantages, tokenizer, batch_cfg)
    batch, layout = arrange(batch, update_cfg, seed=(config.seed, iteration))
    state, metrics = update_fn(state, batch)

docs/method.md §1 item 5 (verl: ppo_mini_batch_size 16 x n 8, one epoch): the N samples of an
iteration are shuffled and split into K = ceil(N / minibatch_size) mini-batches, one optimizer step
each. The split is balanced (sizes differ by at most one sample, all <= minibatch_size) rather than
verl's "full mini-batches and a short last one", so no step rests on a handful of samples.

Layout (rl/update.py reads it): S >= K slots of M = UpdateConfig.minibatch_rows rows; slot k holds
mini-batch k's samples in its first micro-batches, filled in order; slots K..S-1 and the rest of
each slot are padding rows (all zeros, sample_index -1: no mask, no tokens, no compute, no step).
Row of (slot k, sample q): (q % micro_rows) * n_chunks + k * M/micro_rows + q // micro_rows,
with n_chunks = S * M / micro_rows (update.py's strided chunks, so each micro-batch is spread over
the devices of a row-sharded batch).

Static shapes: S = rl.batch.bucket_size(K) takes the values 1..12, 15, 19, 23, 29, 36, ... (growth
<= bucket_growth), so the update compiles once per (S, prompt bucket) pair: for 1..4000 samples in
mini-batches of 128, 17 distinct row counts. The empty slots cost no compute (rl/update.py).

The shuffle is a pure function of `seed` (the trainer passes (config.seed, iteration)), so a
resumed run lays out its batches exactly as the uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

from empo2_jax.rl.batch import bucket_size

SHUFFLE_STREAM = 0x6D62  # keeps this permutation's stream apart from other (seed, n) streams
# Packed slots are sized in powers of two (x micro_rows): padding rows cost the update no compute,
# while every distinct row count is another compile of the update (minutes for a 7B model on a pod;
# on the CPU backend each executable also keeps 10-40 MB of host memory for the process lifetime).
PACKED_SLOT_GROWTH = 2.0


def plan(n_samples: int, minibatch_size: int, bucket_growth: float = 1.25) -> tuple[int, int]:
  """(K optimizer steps, S slots) for n_samples samples (K = 0, S = 1 when there are none)."""
  if minibatch_size < 1:
    raise ValueError(f"minibatch_size must be >= 1, got {minibatch_size}")
  k = math.ceil(n_samples / minibatch_size)
  return k, bucket_size(max(k, 1), 1, bucket_growth)


def split_sizes(n_samples: int, num_minibatches: int) -> list[int]:
  """Balanced sizes: n_samples split into num_minibatches parts differing by at most one."""
  base, extra = divmod(n_samples, max(num_minibatches, 1))
  return [base + (i < extra) for i in range(num_minibatches)]


def arrange(
  batch: dict,
  cfg,
  seed: Union[int, Sequence[int]],
  bucket_growth: float = 1.25,
  min_slots: int = 0,
  min_slot_rows: int = 0,
) -> tuple[dict, dict]:
  """build_batch's (or build_packed_batch's) rows -> (batch in the update's layout,
  {"num_minibatches", "slots", "rows", "slot_rows", "sizes"}).

  batch: numpy arrays with a leading row axis; real rows are those with a sample_index >= 0
  (any order), the rest is dropped. cfg: anything with minibatch_size, micro_rows and
  minibatch_rows (rl.update.UpdateConfig). seed: an int or a sequence of ints (numpy SeedSequence).

  One row per turn (sample_index [B]): K = ceil(N / minibatch_size) balanced mini-batches of
  turns in slots of cfg.minibatch_rows rows. Packed rows (sample_index [B, T]): mini-batches are
  still counted in turn samples: the shuffled rows are cut where the running turn count crosses
  multiples of N / K, so each mini-batch holds about minibatch_size turns (at most T - 1 more;
  when a long row spans a cut, fewer than K mini-batches result and num_minibatches says so);
  the slot size is the largest group's row count, bucketed to micro_rows x a power of two
  (PACKED_SLOT_GROWTH: padding rows are free, new shapes are not). The output also carries
  `slot_steps` [S] int32 (1: the slot takes an optimizer step), whose length tells the update S.
  min_slots / min_slot_rows (a multiple of micro_rows): floors on S and the packed slot size, so
  a run can keep one update shape (the trainer's update_shapes="grow"); the extra slots and rows
  are padding.
  """
  if min_slot_rows % cfg.micro_rows:
    raise ValueError(f"min_slot_rows={min_slot_rows} is not a multiple of micro_rows")
  index = np.asarray(batch["sample_index"])
  counts = (index >= 0).sum(axis=1) if index.ndim == 2 else (index >= 0).astype(np.int64)
  real = np.flatnonzero(counts > 0)
  n_turns = int(counts.sum())
  k, slots = plan(n_turns, cfg.minibatch_size, bucket_growth)
  slots = max(slots, min_slots)
  micro = cfg.micro_rows
  seq = np.random.SeedSequence(list(np.atleast_1d(seed)) + [SHUFFLE_STREAM])
  order = real[np.random.default_rng(seq).permutation(len(real))]
  if index.ndim == 1:
    slot_rows, sizes = cfg.minibatch_rows, split_sizes(len(real), k)
  else:
    before = np.cumsum(counts[order]) - counts[order]  # turns ahead of each row
    group = (before * max(k, 1)) // max(n_turns, 1)
    # A row holds several turns, so a cut can skip a group: those steps are not taken.
    sizes = [int(z) for z in np.bincount(group, minlength=k) if z] if len(real) else []
    k = len(sizes)
    slot_rows = max(bucket_size(max(sizes, default=1), micro, PACKED_SLOT_GROWTH), min_slot_rows)
  rows = slots * slot_rows
  n_chunks = rows // micro

  src = np.full(rows, -1, np.int64)  # physical row -> input row (-1: padding)
  start = 0
  for slot, size in enumerate(sizes):
    q = np.arange(size)
    dest = (q % micro) * n_chunks + slot * (slot_rows // micro) + q // micro
    src[dest] = order[start : start + size]
    start += size

  out = {}
  take = np.maximum(src, 0)
  pad = src < 0
  for key, x in batch.items():
    x = np.asarray(x)
    y = x[take]
    y[pad] = -1 if key == "sample_index" else 0
    out[key] = y
  out["slot_steps"] = np.array(
    [int(i < len(sizes) and sizes[i] > 0) for i in range(slots)], np.int32
  )
  return out, {
    "num_minibatches": k,
    "slots": slots,
    "rows": rows,
    "slot_rows": slot_rows,
    "sizes": list(sizes),
  }


def update_shape(batch: dict, layout: dict) -> dict:
  """An arranged batch's update shape, the keys of the trainer's update floor: token length,
  turns per row (packed; 0 for one row per turn), slots and slot rows (packed; 0 otherwise)."""
  index = batch["sample_index"]
  packed = index.ndim == 2
  return dict(
    len=batch["cur_tokens"].shape[1],
    turns=index.shape[1] if packed else 0,
    slots=layout["slots"],
    slot_rows=layout["slot_rows"] if packed else 0,
  )


__all__ = ["arrange", "plan", "split_sizes", "update_shape", "SHUFFLE_STREAM"]
