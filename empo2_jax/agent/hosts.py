"""Multi-host rollouts: every host runs a contiguous share of a rollout's episodes, then all gather.

    share = host_share(len(specs))              # this host's episode indices (a range)
    ... the actor steps only specs[share], in its own env pool, on its own devices ...
    episodes = gather_episodes(local_episodes)   # every host's episodes, in episode order
    stats = sum_stats(local_stats)               # counters summed over hosts
    tips = gather_values(local_tips)             # any JSON-able values, in episode order

After the gather every host holds the same episodes, so the batch, advantages and metrics built
from them are the same everywhere; memory writes are gathered by memory/sync.py. The episodes'
randomness does not depend on the host: the actor folds each episode's sampling key from its index
in the whole rollout (agent/actor.py).

Transport: an episode (its chat, turns with token ids and log-probs, scores) is JSON; each host's
list is one UTF-8 payload, gathered by memory/sync.allgather_bytes (uint8 arrays padded to the
longest, through jax.experimental.multihost_utils). JSON keeps floats exact (Python writes the
shortest repr that reads back to the same double) and reads back without running code.

Sampling runs on each host's own devices: `local_mesh` gives the host-local mesh (None for one
device) and `sampling_params` a host-local copy of the (pod-sharded) weights, gathered once per
rollout. The whole model is copied to every host, which fits the 0.5B-7B policies of the paper; a
model larger than one host needs a sampler that runs over the global mesh instead.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import numpy as np

import jax

from empo2_jax.agent.episode import Episode
from empo2_jax.memory.sync import allgather_bytes
from empo2_jax.rl.batch import Turn


def host_share(n: int, index: Optional[int] = None, count: Optional[int] = None) -> range:
  """Episode indices of host `index` of `count` (default: this process): contiguous, in process
  order, sizes differing by at most one (the first n % count hosts take one more). A host may get
  none when there are fewer episodes than hosts."""
  index = jax.process_index() if index is None else index
  count = jax.process_count() if count is None else count
  if count < 1 or not 0 <= index < count:
    raise ValueError(f"host index {index} is not in [0, {count})")
  base, extra = divmod(n, count)
  start = index * base + min(index, extra)
  return range(start, start + base + (index < extra))


def episodes_to_bytes(episodes: Sequence) -> bytes:
  return json.dumps([dataclasses.asdict(e) for e in episodes]).encode("utf-8")


def episodes_from_bytes(payload: bytes) -> list:
  out = []
  for d in json.loads(payload.decode("utf-8")):
    d["turns"] = [Turn(**t) for t in d["turns"]]
    out.append(Episode(**d))
  return out


def gather_episodes(episodes: Sequence) -> list:
  """All hosts' episodes in process order (= episode order for `host_share` splits). A
  collective: every process calls it, also with no episodes. One process: the list itself."""
  if jax.process_count() == 1:
    return list(episodes)
  return [
    e
    for payload in allgather_bytes(episodes_to_bytes(episodes))
    for e in episodes_from_bytes(payload)
  ]


def gather_values(values: Sequence) -> list:
  """All hosts' JSON-able `values`, concatenated in process order (episode order for values per
  `host_share` episode). A collective. One process: the list itself."""
  if jax.process_count() == 1:
    return list(values)
  return [
    v
    for payload in allgather_bytes(json.dumps(list(values)).encode("utf-8"))
    for v in json.loads(payload.decode("utf-8"))
  ]


def sum_stats(stats: dict, same_on_all_hosts: Sequence[str] = ()) -> dict:
  """Numeric counters summed over hosts (the keys in `same_on_all_hosts` are taken as they are).
  Every host must pass the same keys."""
  if jax.process_count() == 1:
    return dict(stats)
  keys = sorted(k for k in stats if k not in same_on_all_hosts)
  totals = [0.0] * len(keys)
  for payload in allgather_bytes(json.dumps([[k, stats[k]] for k in keys]).encode("utf-8")):
    got = json.loads(payload.decode("utf-8"))
    if [k for k, _ in got] != keys:
      raise RuntimeError(f"hosts report different rollout stats: {[k for k, _ in got]} vs {keys}")
    totals = [t + v for t, (_, v) in zip(totals, got)]
  out = dict(stats)
  out.update(
    {k: (int(t) if isinstance(stats[k], (int, np.integer)) else t) for k, t in zip(keys, totals)}
  )
  return out


def local_mesh(spec) -> Optional[jax.sharding.Mesh]:
  """The sampling mesh of this host: its own devices, the config's tensor axis if it divides them
  (else 1), the rest fsdp. None for a single local device."""
  devices = jax.local_devices()
  if len(devices) == 1:
    return None
  from empo2_jax.parallel import mesh as mesh_lib

  tensor = int(dict(spec).get("tensor", 1))
  tensor = tensor if tensor > 0 and len(devices) % tensor == 0 else 1
  return mesh_lib.make_mesh({"data": 1, "fsdp": -1, "tensor": tensor}, devices=devices)


def host_values(tree):
  """`tree`'s arrays as host numpy values. One process: jax.device_get. Several: arrays sharded
  over other hosts' devices (the update's per-sample outputs on a pod mesh) cannot be fetched
  locally, so every leaf is gathered whole (a collective every process must call)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def sampling_params(params, mesh: Optional[jax.sharding.Mesh]):
  """The weights for this host's sampler. One process: `params` as they are. Several: a full copy
  gathered from the pod-sharded arrays (a collective), placed on `mesh` (or the default local
  device when mesh is None)."""
  if jax.process_count() == 1:
    return params
  host = host_values(params)
  if mesh is None:
    return jax.tree.map(jax.numpy.asarray, host)
  from empo2_jax.parallel import sharding as shd

  return shd.shard_tree(host, mesh)


__all__ = [
  "host_share",
  "host_values",
  "gather_episodes",
  "episodes_to_bytes",
  "episodes_from_bytes",
  "gather_values",
  "sum_stats",
  "local_mesh",
  "sampling_params",
]
