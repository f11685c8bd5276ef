"""Retrospex's offline data (docs/methods.md §3.2): transitions from saved episodes, a SentencePiece
unigram tokenizer trained on their text, and padded token arrays for the critic.

    records = read_records([".../episodes/tfds/empo2_episodes/1.0.0", ...])  # data/trajectories
    trans = transitions(records, reward="delta")
    spm_bytes = train_tokenizer(corpus(trans), vocab_size=8000)
    tok = Tokenizer(spm_bytes)
    arrays = encode_transitions(trans, tok, max_len=dict(task=64, obs=192, act=24))

A transition is (task, obs, act, reward, next_obs, done) of one turn:
  task      the task description (the "Your task:" line of the episode's first prompt; the task
            name when there is none)
  obs       the observation the turn answered; act its executed action (after correction, as the
            environment ran it)
  reward    "delta" (ScienceWorld in Retrospex): the turn's own reward = score delta;
            "spread" (WebShop/ALFWorld in Retrospex): the episode's final score / episode length on
            every turn
  next_obs  the next turn's observation; done = the episode's last turn. The saved episodes do not
            keep the observation after the last action, so the last turn is terminal whether the
            simulator ended the episode or the step limit did.
Retrospex's ScienceWorld critic also reads the look-around and inventory of every step; the saved
episodes keep neither per step, so the state here is (task, observation) as in its WebShop critic.
Episodes the env pool gave up on (env_failed) are skipped.
"""

from __future__ import annotations

import dataclasses
import io
import re
from typing import Iterable, Sequence

import numpy as np

FIELDS_STATE = ("task", "obs")  # V(s); Q(s, a) adds "act"; V(s') reads (task, next_obs)
REWARDS = ("delta", "spread")
_TASK_LINE = re.compile(r"Your task:\s*(.+)")


@dataclasses.dataclass(frozen=True)
class Transition:
  task: str
  obs: str
  act: str
  reward: float
  next_obs: str
  done: bool


def read_records(paths: Sequence[str]) -> list[dict]:
  """Decoded episode records (data/trajectories.py) of every dataset in `paths` (TFDS version
  directories, or run episode directories holding tfds/empo2_episodes/<version>)."""
  from etils import epath

  from empo2_jax.data import trajectories

  out = []
  for p in paths:
    path = epath.Path(p)
    if not (path / "dataset_info.json").exists():  # a run's workdir or its episodes directory
      found = []
      for pattern in ("tfds/empo2_episodes/*", "episodes/tfds/empo2_episodes/*"):
        found += sorted(path.glob(f"{pattern}/dataset_info.json"))
      if not found:
        raise FileNotFoundError(
          f"no episode dataset under {p}: pass a run trained with "
          "--config.train.save_episodes=True (its workdir, or the TFDS version directory)"
        )
      path = found[-1].parent
    source = trajectories.load(path)
    out += [trajectories.decode(source[i]) for i in range(len(source))]
  return out


def task_text(record: dict) -> str:
  prompts = record["turns"]["prompt"]
  m = _TASK_LINE.search(prompts[0]) if prompts else None
  return m.group(1).strip() if m else str(record["task"])


def transitions(records: Iterable[dict], reward: str = "delta") -> list[Transition]:
  if reward not in REWARDS:
    raise ValueError(f"reward={reward!r}; valid: {', '.join(REWARDS)}")
  out = []
  for r in records:
    turns = r["turns"]
    n = len(turns["executed_action"])
    if r.get("env_failed") or n == 0:
      continue
    task = task_text(r)
    for t in range(n):
      rew = float(turns["reward"][t]) if reward == "delta" else float(r["score"]) / n
      nxt = turns["observation"][t + 1] if t + 1 < n else ""
      out.append(
        Transition(task, turns["observation"][t], turns["executed_action"][t], rew, nxt, t == n - 1)
      )
  return out


def corpus(trans: Sequence[Transition]) -> list[str]:
  """The distinct texts of the transitions (what the tokenizer is trained on)."""
  seen = dict.fromkeys(x for t in trans for x in (t.task, t.obs, t.act, t.next_obs) if x)
  return list(seen)


def train_tokenizer(texts: Sequence[str], vocab_size: int = 8000) -> bytes:
  """A SentencePiece unigram model trained on `texts`; its serialized proto. The vocabulary is
  at most vocab_size (a soft limit: a small corpus yields fewer pieces)."""
  import sentencepiece as spm

  texts = [t.replace("\n", " ") for t in texts if t.strip()]
  if not texts:
    raise ValueError("no text to train the tokenizer on (no transitions?)")
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_writer=buf,
    vocab_size=vocab_size,
    model_type="unigram",
    hard_vocab_limit=False,
    minloglevel=2,
  )
  return buf.getvalue()


class Tokenizer:
  """A trained SentencePiece model: texts -> (ids [N, L] int32, lengths [N] int32), each text cut
  to its first `max_len` pieces and at least one token long (an empty text is [unk])."""

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm

    self.proto = model_proto
    self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = int(self.sp.get_piece_size())

  def encode(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    pieces = self.sp.encode([t.replace("\n", " ") for t in texts])
    ids = np.zeros((len(texts), max_len), np.int32)
    lengths = np.ones(len(texts), np.int32)
    for i, p in enumerate(pieces):
      p = p[:max_len] or [self.sp.unk_id()]
      ids[i, : len(p)] = p
      lengths[i] = len(p)
    return ids, lengths


DEFAULT_MAX_LEN = dict(task=64, obs=192, act=24)


def encode_fields(tok: Tokenizer, max_len: dict, **texts: Sequence[str]) -> dict:
  """{f"{name}_ids", f"{name}_len"} for each text field; obs-like fields (obs, next_obs) use
  max_len["obs"]."""
  out = {}
  for name, values in texts.items():
    ids, lens = tok.encode(values, max_len["obs" if name == "next_obs" else name])
    out[f"{name}_ids"], out[f"{name}_len"] = ids, lens
  return out


def encode_transitions(trans: Sequence[Transition], tok: Tokenizer, max_len=None) -> dict:
  """Token arrays for every field plus reward [N] float32 and done [N] float32."""
  max_len = dict(DEFAULT_MAX_LEN, **(max_len or {}))
  out = encode_fields(
    tok,
    max_len,
    task=[t.task for t in trans],
    obs=[t.obs for t in trans],
    act=[t.act for t in trans],
    next_obs=[t.next_obs for t in trans],
  )
  out["reward"] = np.array([t.reward for t in trans], np.float32)
  out["done"] = np.array([t.done for t in trans], np.float32)
  return out


__all__ = [
  "Transition",
  "read_records",
  "task_text",
  "transitions",
  "corpus",
  "train_tokenizer",
  "Tokenizer",
  "encode_fields",
  "encode_transitions",
  "DEFAULT_MAX_LEN",
]
