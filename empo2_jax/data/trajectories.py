"""A run's episodes as a TFDS dataset (array_record files), for offline methods to read back.

    log = EpisodeLog(workdir + "/episodes")
    log.write(iteration, episodes)     # each iteration: one JSONL staging file (atomic)
    path = log.build_dataset()         # end of run: TFDS dataset <dir>/tfds/empo2_episodes/1.0.0
    source = load(path)                # random access: source[i], len(source); no TensorFlow
                                       # (local or gs://: read through a temporary local copy)
    record = decode(source[i])         # plain python values, the same dict `episode_record` made

One example per episode (key `it<iteration>-<rollout>`; TFDS stores examples in the order of a hash
of the key, so read back by `episode_id`, not by position):
  episode_id, iteration, task, variation, group_id, rollout_id, mode, use_memory, score, success,
  env_failed, tip (the reflection written after the episode),
  turns: observation, prompt (the user message of that step, tips included), raw_action (the model's
         text), executed_action (after correction), reward, intrinsic, advantage (the turn's
         advantage in the update; NaN where it was not trained on), num_tips, num_tokens,
         lowprob_masked (1: the low-probability mask removed the sample, 0: kept, -1: not in the
         update), min_old_logp (its lowest old log-prob; 0 where lowprob_masked is -1),
  tips: the tip texts shown, all turns concatenated (turn t owns num_tips[t] of them, in order),
  response_ids / sampler_logprobs: the sampled tokens and their log-probs, concatenated over turns
         (turn t owns num_tokens[t]).
Per-turn lists are flattened to the episode because TFDS serialises nested variable-length sequences
through TensorFlow's RaggedTensor, and TensorFlow is not a dependency; flat sequences are pure
numpy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import weakref
from typing import Callable, Iterable, Optional

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from empo2_jax import remote

DATASET_VERSION = "1.0.0"
_STAGING = re.compile(r"iter-(\d+)\.jsonl$")


def _f32(x):
  return float(np.float32(x))  # what the float32 feature gives back


def _or_nan(x) -> float:
  return float("nan") if x is None else float(x)


def _masked_flag(x) -> int:
  """A turn's low-probability mask flag as stored: 1 masked, 0 kept, -1 not in the update."""
  return -1 if x is None else int(bool(x))


def episode_record(episode, iteration: int) -> dict:
  """The dataset example of one actor.Episode (plain python; floats rounded to float32)."""
  e, turns = episode, episode.turns
  shown = list(getattr(e, "tips_shown", [])) or [[] for _ in turns]
  prompts = [
    next((m["content"] for m in reversed(t.messages) if m["role"] == "user"), "") for t in turns
  ]
  return {
    "episode_id": f"it{int(iteration):08d}-{int(e.rollout_id):05d}",
    "iteration": int(iteration),
    "task": e.task,
    "variation": int(e.variation),
    "group_id": int(e.group_id),
    "rollout_id": int(e.rollout_id),
    "mode": e.mode,
    "use_memory": bool(e.use_memory),
    "score": _f32(e.score),
    "success": bool(e.success),
    "env_failed": bool(e.env_failed),
    "tip": e.tip,
    "turns": {
      "observation": [str(o) for o in e.observations[: len(turns)]],
      "prompt": prompts,
      "raw_action": [t.response for t in turns],
      "executed_action": [str(a) for a in e.executed[: len(turns)]],
      "reward": [_f32(t.reward) for t in turns],
      "intrinsic": [_f32(t.intrinsic) for t in turns],
      "advantage": [_f32(_or_nan(getattr(t, "advantage", None))) for t in turns],
      "num_tips": [len(s) for s in shown[: len(turns)]],
      "num_tokens": [len(t.response_ids) for t in turns],
      "lowprob_masked": [_masked_flag(getattr(t, "lowprob_masked", None)) for t in turns],
      "min_old_logp": [_f32(getattr(t, "min_old_logp", None) or 0.0) for t in turns],
    },
    "tips": [tip for s in shown[: len(turns)] for tip in s],
    "response_ids": [int(x) for t in turns for x in t.response_ids],
    "sampler_logprobs": [_f32(x) for t in turns for x in t.sampler_logprobs],
  }


def _features():
  text, f = tfds.features.Text(), tfds.features
  return f.FeaturesDict(
    {
      "episode_id": text,
      "iteration": np.int32,
      "task": text,
      "variation": np.int32,
      "group_id": np.int32,
      "rollout_id": np.int32,
      "mode": text,
      "use_memory": np.bool_,
      "score": np.float32,
      "success": np.bool_,
      "env_failed": np.bool_,
      "tip": text,
      "turns": f.Sequence(
        {
          "observation": text,
          "prompt": text,
          "raw_action": text,
          "executed_action": text,
          "reward": np.float32,
          "intrinsic": np.float32,
          "advantage": np.float32,
          "num_tips": np.int32,
          "num_tokens": np.int32,
          "lowprob_masked": np.int32,
          "min_old_logp": np.float32,
        }
      ),
      "tips": f.Sequence(text),
      "response_ids": f.Sequence(np.int32),
      "sampler_logprobs": f.Sequence(np.float32),
    }
  )


class Empo2Episodes(tfds.core.GeneratorBasedBuilder):
  """Episodes of an EMPO2 run; `records` yields `episode_record` dicts (one split, 'train')."""

  VERSION = tfds.core.Version(DATASET_VERSION)
  RELEASE_NOTES = {DATASET_VERSION: "Episodes with turns, tips shown, modes and sampled tokens."}
  # No download checksums to look up next to this file. (TFDS 4.9.10 locates them through
  # `importlib_resources`, which it does not install, for any builder defined inside a package.)
  code_path = None

  def __init__(self, *, records: Optional[Callable[[], Iterable[dict]]] = None, **kwargs):
    self._records = records
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description="EMPO2 training episodes (empo2_jax.data.trajectories).",
      features=_features(),
      homepage="https://arxiv.org/abs/2602.23008",  # EMPO2 (docs/method.md)
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    if self._records is None:
      raise ValueError("Empo2Episodes needs records=... to generate; read with load(path)")
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    seen = set()
    for r in self._records():
      if r["episode_id"] in seen:
        raise ValueError(f"episode {r['episode_id']} is written twice")
      seen.add(r["episode_id"])
      yield r["episode_id"], r


def write_dataset(records: Callable[[], Iterable[dict]], data_dir) -> epath.Path:
  """Build the dataset under data_dir (replacing an older build); returns its version directory.
  A remote data_dir (gs://) is built in a local temporary directory, then uploaded: the
  array_record writer opens its files itself, without etils/gcsfs."""
  if remote.is_remote(data_dir):
    with tempfile.TemporaryDirectory(prefix="empo2_tfds_") as tmp:
      rel = os.path.relpath(write_dataset(records, tmp), tmp)
      out = epath.Path(data_dir) / rel
      if out.exists():
        out.rmtree()
      remote.upload_dir(tmp, data_dir)
    return out
  data_dir = epath.Path(data_dir)
  builder = Empo2Episodes(records=records, data_dir=str(data_dir), file_format="array_record")
  out = epath.Path(builder.data_dir)
  if out.exists():
    out.rmtree()
  builder = Empo2Episodes(records=records, data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare(
    download_config=tfds.download.DownloadConfig(
      download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS
    )
  )
  return epath.Path(builder.data_dir)


def load(path, split: str = "train"):
  """Random-access source of a written dataset (the version directory write_dataset returned).

  A remote version directory (gs://) is first copied, file by file in chunks, into a local
  temporary directory that lives as long as the returned source (removed when it is garbage
  collected, or at exit): the array_record reader opens its files itself, and on gs:// it would
  not read them (it blocks), although TFDS's metadata reads go through etils."""
  if not remote.is_remote(path):
    return tfds.builder_from_directory(str(path)).as_data_source()[split]
  remote.check(path)
  src = epath.Path(path)
  if not (src / "dataset_info.json").exists():
    raise FileNotFoundError(
      f"no episode dataset at {path} (no dataset_info.json): pass the TFDS version directory "
      "that write_dataset returned (<workdir>/episodes/tfds/empo2_episodes/<version>)"
    )
  tmp = tempfile.mkdtemp(prefix="empo2_tfds_read_")
  try:
    local = os.path.join(tmp, src.name)  # TFDS reads the version from the directory name
    os.makedirs(local)
    for f in src.iterdir():
      if not f.is_dir():
        remote.copy_file(f, os.path.join(local, f.name))
    source = tfds.builder_from_directory(local).as_data_source()[split]
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  weakref.finalize(source, shutil.rmtree, tmp, True)
  return source


def decode(example) -> dict:
  """A data-source example as plain python (str, int, float, bool, lists), like episode_record."""
  if isinstance(example, dict):
    return {k: decode(v) for k, v in example.items()}
  if isinstance(example, bytes):
    return example.decode("utf-8")
  if isinstance(example, (list, tuple)) or (isinstance(example, np.ndarray) and example.ndim):
    return [decode(x) for x in example]
  if isinstance(example, (np.bool_, bool)):
    return bool(example)
  if isinstance(example, (np.integer, int)):
    return int(example)
  if isinstance(example, (np.floating, float)):
    return float(example)
  if isinstance(example, np.ndarray):
    return decode(example.item())
  return example


class EpisodeLog:
  """Per-iteration JSONL staging of a run's episodes under `directory`, and the dataset build."""

  def __init__(self, directory):
    self.directory = epath.Path(directory)
    self.staging = self.directory / "staging"
    self.staging.mkdir(parents=True, exist_ok=True)

  def _files(self) -> list[tuple[int, epath.Path]]:
    out = [
      (int(m.group(1)), p)
      for p in self.staging.glob("iter-*.jsonl")
      if (m := _STAGING.search(p.name))
    ]
    return sorted(out)

  def write(self, iteration: int, episodes) -> epath.Path:
    path = self.staging / f"iter-{int(iteration):08d}.jsonl"
    tmp = self.staging / f".{path.name}.tmp"
    tmp.write_text("".join(json.dumps(episode_record(e, iteration)) + "\n" for e in episodes))
    tmp.replace(path)
    return path

  def drop_after(self, iteration: int) -> None:
    """Forget iterations past `iteration` (a resumed run writes them again)."""
    for it, p in self._files():
      if it > iteration:
        p.unlink()

  def records(self) -> Iterable[dict]:
    for _, p in self._files():
      for line in p.read_text().splitlines():
        if line.strip():
          yield json.loads(line)

  def build_dataset(self) -> epath.Path:
    return write_dataset(self.records, self.directory / "tfds")


__all__ = ["EpisodeLog", "Empo2Episodes", "episode_record", "write_dataset", "load", "decode"]
