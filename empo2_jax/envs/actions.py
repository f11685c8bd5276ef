"""Action text handling: normalisation, word-level Jaccard correction, ambiguity prompts.

The agent writes free text; the simulator accepts only what its parser understands.
`correct_action` maps it to the valid action with the highest word-level Jaccard overlap: only when
the parser rejects the text (CORRECTION_MODES "on_reject", ours) or for every action ("always", the
release's choice). Ties are broken by character-level similarity (rescues typos), then by fewer
words, then alphabetically, so the choice never depends on the order the simulator lists actions in
(that order varies between runs of the same variation).
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import Sequence

from empo2_jax.text import printable_text

# Messages the ScienceWorld parser answers with when it cannot use the input (no move is spent).
PARSER_REJECTION = "No known action matches that input."
AMBIGUITY_PREFIX = "Ambiguous request"
# Executed when the text shares no word with any valid action: harmless and informative.
DEFAULT_FALLBACK_ACTION = "look around"
# When the text is mapped to a valid action: "on_reject" only when the parser rejects it (fast: the
# valid actions are fetched only then); "always" every step, as the authors' release does.
CORRECTION_MODES = ("on_reject", "always")
# The answer to an ambiguity prompt: its first option, as the release answers (in the same step).
AMBIGUITY_ANSWER = "0"

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
_OPTION_RE = re.compile(r"^\s*(\d+):\s*(.+?)\s*$")


def normalize_action(text: str) -> str:
  """Printable text (`printable_text`), whitespace collapsed, ends stripped; the parser is
  case-insensitive."""
  return " ".join(printable_text(text).split())


@functools.lru_cache(maxsize=1 << 16)  # the same valid actions come back step after step
def words(text: str) -> frozenset[str]:
  """Lower-cased alphanumeric words of `text` (punctuation and underscores split words)."""
  return frozenset(w.lower() for w in _WORD_RE.findall(text))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
  """|a & b| / |a | b|, 0 when both are empty."""
  union = len(a | b)
  return len(a & b) / union if union else 0.0


def rank_key(text: str, candidate: str) -> tuple:
  """Sort key, smallest is best: Jaccard, char similarity, fewer words, alphabetical."""
  jac = jaccard(words(text), words(candidate))
  char_sim = difflib.SequenceMatcher(None, text.lower(), candidate.lower()).ratio()
  return (-jac, -char_sim, len(candidate.split()), candidate)


def correct_action(
  text: str, valid_actions: Sequence[str], fallback: str | None = DEFAULT_FALLBACK_ACTION
) -> str:
  """Returns the valid action closest to `text` by word-level Jaccard overlap.

  When no candidate shares a word with `text` (empty text, another language, gibberish) the result
  is `fallback` if it is among the valid actions; with `fallback=None` the tie-breaking decides.
  """
  candidates = sorted(set(valid_actions))
  if not candidates:
    raise ValueError("correct_action needs at least one valid action; the list is empty.")
  text_words = words(text)
  scored = [(jaccard(text_words, words(c)), c) for c in candidates]
  best_jac = max(jac for jac, _ in scored)
  if best_jac == 0.0 and fallback is not None and fallback in candidates:
    return fallback
  # Character similarity is only computed for the candidates tied on the primary key.
  tied = [c for jac, c in scored if jac == best_jac]
  return min(tied, key=lambda c: rank_key(text, c))


def parse_ambiguity_options(observation: str) -> dict[str, str] | None:
  """Options of an 'Ambiguous request' prompt as {number: action text}, or None for other text."""
  if not observation.startswith(AMBIGUITY_PREFIX):
    return None
  options = {}
  for line in observation.splitlines()[1:]:
    m = _OPTION_RE.match(line)
    if m:
      options[m.group(1)] = m.group(2)
  return options
