"""Batched generation over a preallocated KV cache: jitted chunked prefill + jitted decode loop.

Two entry points:
  generate(params, config, prompts, *, max_new_tokens, temperature, top_p, top_k, stop_ids, rng)
      one-shot: returns [(tokens int32 [n], logprobs float32 [n])] per prompt, n <= max_new_tokens;
      tokens include the stop token when one was hit.
  Session (empo2_jax/sampling/session.py): multi-turn rows that keep their KV cache between calls
      and prefill only the new suffix of each row's chat (see that module's docstring).

Log-probs are under the sampling distribution after temperature, top-k and top-p (kernels.py says
exactly how; greedy reports log_softmax of the raw logits). Row r draws with its own key
fold_in(rng, r) (then fold_in(., step) per token), so a row's samples do not depend on the batch.

Bounded compilation: every device call has a shape drawn from small fixed sets: the batch is padded
to a size in `SamplerSettings.batch_sizes`, the cache length to one of `cache_lengths` (generate)
or fixed for a session, prefill runs in chunks whose lengths come from `prefill_chunks` (those whose
rows x length fit `prefill_tokens`), the output buffer from `new_token_buckets`, the stop-id list
is padded to `max_stop_ids`; temperature, top-p, top-k and max_new_tokens are traced values.
Only three sampling modes (greedy / sample / filter) are static. `Engine.traces` counts traces per
jitted function (a Python side effect that runs only while tracing), which the tests assert on.
The cache is donated to every call.

Mesh: params may arrive already sharded (parallel/sharding.shard_tree); pass `mesh` and the cache
rows and per-row inputs are placed with the batch over (data, fsdp) (parallel/sharding.BATCH_AXES);
jit follows the input shardings. Without a mesh everything runs on the default device.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np

import jax
import jax.numpy as jnp

from empo2_jax.model import kv_cache, llama
from empo2_jax.model.configs import DTYPES, LlamaConfig
from empo2_jax.sampling import kernels


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
  cache_dtype: str = "bfloat16"
  # ascending; the last is the max. Each turn prefills only its new suffix (~100-300 tokens in
  # EMPO2's chats), so the sizes in between keep the padding of the last chunk small.
  prefill_chunks: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
  # A prefill call computes at most this many tokens (rows x chunk length): longer suffixes take
  # more chunks (the smallest chunk is always allowed). None: PREFILL_TOKENS of the backend. On
  # XLA:CPU, 8 rows of ~1,000-token prompts prefilled at 136-138 GFLOP/s in 128-token chunks
  # against 78-82 in 1,024-token ones (a layer's activations and score tiles stay in the caches).
  prefill_tokens: Optional[int] = None
  cache_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
  batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # beyond: multiples of last
  new_token_buckets: tuple[int, ...] = (32, 128, 512, 2048)
  max_stop_ids: int = 8
  # Prefill and decode read one weight array per layer (llama.split_layers: a copy of the layer
  # weights, made once per Session or generate call) instead of slicing each layer out of the
  # stacked params on every step, which XLA:CPU does by copying the layer. Same numbers.
  split_layers: bool = True

  def __post_init__(self):
    if self.cache_dtype not in DTYPES:
      raise ValueError(
        f"rollout.cache_dtype={self.cache_dtype!r}; valid: {', '.join(sorted(DTYPES))}"
      )
    if self.prefill_tokens is not None and self.prefill_tokens < 1:
      raise ValueError(
        f"SamplerSettings.prefill_tokens={self.prefill_tokens} must be a positive int or None"
      )
    for name in ("prefill_chunks", "cache_lengths", "batch_sizes", "new_token_buckets"):
      v = getattr(self, name)
      if not v or list(v) != sorted(set(v)) or v[0] < 1:
        raise ValueError(
          f"SamplerSettings.{name}={v} must be a non-empty ascending tuple of positive ints"
        )

  @property
  def max_chunk(self) -> int:
    return self.prefill_chunks[-1]

  def chunks_for(self, rows: int, backend: Optional[str] = None) -> tuple[int, ...]:
    """The prefill chunk lengths a call over `rows` rows may use: those within the token budget
    (prefill_tokens, else PREFILL_TOKENS of `backend`, default jax's), at least the smallest."""
    budget = self.prefill_tokens
    if budget is None:
      budget = PREFILL_TOKENS.get(backend or jax.default_backend(), PREFILL_TOKENS["default"])
    fit = tuple(c for c in self.prefill_chunks if c * max(rows, 1) <= budget)
    return fit or self.prefill_chunks[:1]


# Tokens a prefill call computes at most, by backend (SamplerSettings.prefill_tokens overrides).
# CPU: measured (the field's comment); accelerators: large matmuls keep their units busy.
PREFILL_TOKENS = {"cpu": 1024, "default": 16384}


def bucket(n: int, sizes: Sequence[int], what: str, *, multiples: bool = False) -> int:
  """Smallest size >= n; past the largest, a multiple of it (if allowed) or an error."""
  for s in sizes:
    if s >= n:
      return s
  if multiples:
    return -(-n // sizes[-1]) * sizes[-1]
  raise ValueError(
    f"{what}={n} exceeds the largest bucket {sizes[-1]}; add a larger one to SamplerSettings"
  )


def chunk_plan(remaining: int, chunks: Sequence[int]) -> list[int]:
  """Chunk lengths covering `remaining` new tokens: full max chunks; below the max, the largest
  chunk that fills when it and the bucket of what it leaves compute fewer tokens than the bucket
  of the whole rest (180 with (.., 64, 128, 256): 128 + 64, not 256), else that bucket."""
  plan = []
  while remaining > 0:
    if remaining >= chunks[-1]:
      c = chunks[-1]
    else:
      c = bucket(remaining, chunks, "chunk")
      fill = [x for x in chunks if x < remaining]
      if fill and fill[-1] + bucket(remaining - fill[-1], chunks, "chunk") < c:
        c = fill[-1]
    plan.append(c)
    remaining -= c
  return plan


def row_keys(rng: jax.Array, rows: Sequence[int]) -> jax.Array:
  """One key per row: fold_in(rng, row id)."""
  return _row_keys(rng, jax.device_put(np.asarray(rows, np.uint32)))


@jax.jit
def _row_keys(rng, rows):
  # One program per row count. Run eagerly, the vmap compiled each of its primitives per count,
  # and every compiled program stays resident (~2-5 MB of host memory each, for the process).
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(rows)


class Engine:
  """The jitted device functions for one (model config, settings) pair, with a trace counter."""

  def __init__(
    self,
    config: LlamaConfig,
    settings: SamplerSettings = SamplerSettings(),
    mesh: Optional[jax.sharding.Mesh] = None,
  ):
    if mesh is not None and mesh.size > 1 and config.decode_kernels == "auto":
      # the CPU decode kernels have no sharding rule (XLA would gather their operands)
      config = dataclasses.replace(config, decode_kernels="xla")
    self.config, self.settings, self.mesh = config, settings, mesh
    self.traces: collections.Counter = collections.Counter()
    self._prefill = jax.jit(self._prefill_impl, donate_argnums=(1,))
    self._prefill_rows = jax.jit(self._prefill_rows_impl, donate_argnums=(1, 2))
    self._split = jax.jit(llama.split_layers)
    self._transposed = jax.jit(functools.partial(llama.with_transposed, config=config))
    self._decode = jax.jit(
      self._decode_impl, static_argnames=("mode", "buffer"), donate_argnums=(1,)
    )

  def prepare(self, params):
    """The params as prefill and decode take them fastest, computed once: split_layers, and with
    the CPU decode kernels (llama.decode_kernels) a transposed copy of the weights they read."""
    if self.settings.split_layers and not isinstance(params["layers"], (list, tuple)):
      params = self._split(params)
    if llama.decode_kernels(self.config) and "wqkv_t" not in _first_layer(params):
      params = self._transposed(params)
    return params

  @property
  def num_traces(self) -> int:
    return sum(self.traces.values())

  def _prefill_impl(self, params, cache, hidden, tokens, mask, start, end):
    self.traces["prefill"] += 1
    return kernels.prefill_chunk(params, self.config, cache, hidden, tokens, mask, start, end)

  def _prefill_rows_impl(self, params, cache, hidden, idx, tokens, mask, start, end):
    """prefill_chunk on cache rows `idx` only, written and read in place (rows outside idx are
    untouched; attention reads only the cache blocks below the chunk's furthest slot)."""
    self.traces["prefill_rows"] += 1
    cache, h = kernels.prefill_chunk(
      params, self.config, cache, hidden[idx], tokens, mask, start, end, rows=idx
    )
    return cache, hidden.at[idx].set(h)

  def _decode_impl(
    self,
    params,
    cache,
    hidden,
    length,
    active,
    keys,
    temperature,
    top_p,
    top_k,
    stop_ids,
    max_new,
    *,
    mode,
    buffer,
  ):
    self.traces["decode"] += 1
    return kernels.decode(
      params,
      self.config,
      cache,
      hidden,
      length,
      active,
      keys,
      temperature,
      top_p,
      top_k,
      stop_ids,
      max_new,
      mode=mode,
      buffer=buffer,
    )

  # -- placement ---------------------------------------------------------------------------------
  def batch_multiple(self) -> int:
    if self.mesh is None:
      return 1
    from empo2_jax.parallel.sharding import BATCH_AXES

    return int(np.prod([self.mesh.shape[a] for a in BATCH_AXES]))

  def place_rows(self, x, batch_dim: int = 0):
    """Place a per-row array with rows over the mesh's batch axes (no-op without a mesh)."""
    if self.mesh is None:
      # device_put, not jnp.asarray: asarray of a host array compiles a small program per new
      # shape (jax's `stage`), and each stays resident; device_put compiles nothing.
      return jax.device_put(x)
    from jax.sharding import NamedSharding, PartitionSpec as P
    from empo2_jax.parallel.sharding import BATCH_AXES

    spec = P(*([None] * batch_dim), BATCH_AXES)
    return jax.device_put(x, NamedSharding(self.mesh, spec))

  def new_cache(self, batch: int, length: int):
    if batch % self.batch_multiple():
      raise ValueError(
        f"batch {batch} is not divisible by the mesh's data*fsdp size {self.batch_multiple()}"
      )
    cache = kv_cache.init_cache(self.config, batch, length, DTYPES[self.settings.cache_dtype])
    return {
      "k": self.place_rows(cache["k"], 1),
      "v": self.place_rows(cache["v"], 1),
      "mask": self.place_rows(cache["mask"]),
    }

  def new_hidden(self, batch: int):
    return self.place_rows(
      jnp.zeros((batch, self.config.hidden_size), self.config.jnp_compute_dtype)
    )

  # -- host drivers --------------------------------------------------------------------------------
  def prefill(
    self, params, cache, hidden, suffixes: Sequence[Optional[Sequence[int]]], start: np.ndarray
  ):
    """Append suffixes[b] (None / empty = row untouched) to row b whose cache holds start[b].

    Requires start[b] + len(suffix) + max_chunk <= cache length (padded writes never clamp).
    Returns (cache, hidden, tokens computed including padding).
    """
    b, s = len(suffixes), cache["mask"].shape[1]
    lens = np.array([len(x) if x is not None else 0 for x in suffixes], np.int64)
    start = np.asarray(start, np.int64)
    over = np.nonzero(start + lens + self.settings.max_chunk > s)[0]
    if over.size:
      r = int(over[0])
      raise ValueError(
        f"row {r}: {start[r]} cached + {lens[r]} new tokens + chunk headroom "
        f"{self.settings.max_chunk} exceed the cache length {s}"
      )
    done, computed = np.zeros(b, np.int64), 0
    for c in chunk_plan(int(lens.max(initial=0)), self.settings.chunks_for(b)):
      rows = self._chunk_rows(lens - done, start + done, c)
      n = len(rows)
      tokens, mask = np.zeros((n, c), np.int32), np.zeros((n, c), np.int32)
      end = np.full(n, -1, np.int32)
      for j, r in enumerate(rows):
        take = min(c, lens[r] - done[r])
        if take <= 0:
          continue
        tokens[j, :take] = suffixes[r][done[r] : done[r] + take]
        mask[j, :take] = 1
        if done[r] + take == lens[r]:
          end[j] = take - 1
      pos = (start + done)[rows].astype(np.int32)
      if n == b:  # every row: no row index
        cache, hidden = self._prefill(
          params,
          cache,
          hidden,
          self.place_rows(tokens),
          self.place_rows(mask),
          self.place_rows(pos),
          self.place_rows(end),
        )
      else:
        cache, hidden = self._prefill_rows(
          params,
          cache,
          hidden,
          *jax.device_put((np.asarray(rows, np.int32), tokens, mask, pos, end)),
        )
      done += np.minimum(c, lens - done).clip(min=0)
      computed += n * c
    return cache, hidden, computed

  def _chunk_rows(self, left: np.ndarray, pos: np.ndarray, c: int) -> np.ndarray:
    """Rows a prefill chunk computes: those with new tokens left, padded with idle rows (the
    lowest cache positions first, so attention reads few cache blocks) to a batch bucket. With a
    mesh that shards rows, or when the bucket is the whole batch, every row (rows stay put)."""
    b = len(left)
    if self.batch_multiple() > 1:
      return np.arange(b)
    busy = np.nonzero(left > 0)[0]
    n = min(bucket(max(len(busy), 1), self.settings.batch_sizes, "batch", multiples=True), b)
    if n >= b:
      return np.arange(b)
    idle = np.setdiff1d(np.arange(b), busy)
    pad = idle[np.argsort(pos[idle], kind="stable")][: n - len(busy)]
    return np.sort(np.concatenate([busy, pad]))

  def decode(
    self,
    params,
    cache,
    hidden,
    length: np.ndarray,
    active: np.ndarray,
    keys,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    stop_ids: Sequence[int],
  ):
    """Returns (cache, tokens [B, buf], logprobs [B, buf], counts [B], lengths [B]) on host."""
    mode = kernels.mode_for(temperature, top_p, top_k)
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    stops = sorted(set(int(t) for t in stop_ids))
    if len(stops) > self.settings.max_stop_ids:
      raise ValueError(
        f"{len(stops)} stop ids > SamplerSettings.max_stop_ids={self.settings.max_stop_ids}"
      )
    stop_arr = np.full(self.settings.max_stop_ids, -1, np.int32)
    stop_arr[: len(stops)] = stops
    buf = bucket(max_new_tokens, self.settings.new_token_buckets, "max_new_tokens")
    cache, toks, lps, counts, lengths = self._decode(
      params,
      cache,
      hidden,
      self.place_rows(np.asarray(length, np.int32)),
      self.place_rows(np.asarray(active, bool)),
      keys,
      jnp.float32(max(temperature, 1e-6)),
      jnp.float32(top_p),
      jnp.int32(top_k),
      jax.device_put(stop_arr),
      jnp.int32(max_new_tokens),
      mode=mode,
      buffer=buf,
    )
    return cache, np.asarray(toks), np.asarray(lps), np.asarray(counts), np.asarray(lengths)


def _first_layer(params):
  layers = params["layers"]
  return layers[0] if isinstance(layers, (list, tuple)) else layers


def get_engine(
  config: LlamaConfig,
  settings: SamplerSettings = SamplerSettings(),
  mesh: Optional[jax.sharding.Mesh] = None,
) -> Engine:
  """A shared Engine per (config, settings, mesh), so repeated generate() calls reuse
  compilations."""
  return _engine(config, settings, mesh)


@functools.lru_cache(maxsize=16)
def _engine(config, settings, mesh) -> Engine:
  return Engine(config, settings, mesh)


def generate(
  params,
  config: LlamaConfig,
  prompts: Sequence[Sequence[int]],
  *,
  max_new_tokens: int,
  temperature: float = 1.0,
  top_p: float = 1.0,
  top_k: int = 0,
  stop_ids: Sequence[int] = (),
  rng: jax.Array,
  settings: SamplerSettings = SamplerSettings(),
  mesh: Optional[jax.sharding.Mesh] = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """One-shot batched sampling. Returns [(tokens int32 [n], logprobs float32 [n])] per prompt."""
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("generate needs a non-empty list of non-empty prompts")
  engine = get_engine(config, settings, mesh)
  n = len(prompts)
  b = bucket(n, settings.batch_sizes, "batch", multiples=True)
  b = -(-b // engine.batch_multiple()) * engine.batch_multiple()
  longest = max(len(p) for p in prompts)
  s = bucket(
    longest + max_new_tokens + settings.max_chunk,
    settings.cache_lengths,
    "prompt + max_new_tokens + chunk headroom",
  )
  params = engine.prepare(params)
  cache, hidden = engine.new_cache(b, s), engine.new_hidden(b)
  suffixes = list(prompts) + [None] * (b - n)
  cache, hidden, _ = engine.prefill(params, cache, hidden, suffixes, np.zeros(b, np.int64))
  length = np.array([len(p) for p in prompts] + [0] * (b - n))
  active = np.arange(b) < n
  _, toks, lps, counts, _ = engine.decode(
    params,
    cache,
    hidden,
    length,
    active,
    engine.place_rows(row_keys(rng, range(b))),
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_p=top_p,
    top_k=top_k,
    stop_ids=stop_ids,
  )
  return [(toks[r, : counts[r]].copy(), lps[r, : counts[r]].copy()) for r in range(n)]
