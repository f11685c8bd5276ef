"""Product search: BM25 over the documents of the original WebShop Lucene index.

The original indexes one document per product with pyserini 0.17 (Anserini 0.14.3, Lucene 8),
contents = lower(" ".join([Title, Description, BulletPoints[0], option_text])) where option_text is
", and ".join("name: v1, v2, ..."), and answers `search[q]` with the top 50 hits for the
lower-cased query (10 per results page), with pyserini's defaults: BM25 k1 = 0.9, b = 0.4, the
English analyzer, a query as the bag of its analysed terms (a repeated term counts twice), ties
broken by ascending document id (the asin).

Backends (`SearchEngine(..., backend=...)`):
  "lucene" (default) Lucene 8's BM25 written out with numpy/scipy: idf = ln(1 + (N - df + 0.5) /
           (df + 0.5)), term score idf * tf / (tf + k1 * (1 - b + b * dl / avgdl)) where dl is the
           document length as Lucene stores it (one byte: exact below 24 terms, then 4 significant
           bits, `lucene_length`) and avgdl the exact mean length. Checked against the real thing:
           Anserini 0.14.3 (the jar of pyserini 0.17.0, the version WebShop pins) indexing the
           bundled fixture returned the same top-50 lists, in the same order, for all 344 test
           queries (every goal query, 250 instructions, a few odd strings).
  "bm25s"  the bm25s library (method "lucene", same k1, b and analyzer) with exact document
           lengths; on the same 344 queries: the same top-50 list for 141, the same first page
           for 303, the same top hit for 336 (the differences come from the length encoding).

Analyzer (Anserini's default English analyzer, as `Analyzer`): Unicode word tokens, where '.',
apostrophes and ':' join letters on both sides ("u.s.a", "men's") and '.', ',' and ';' join digits
("3.5", "1,000"), as Lucene's StandardTokenizer segments; a trailing 's removed; lower case;
Lucene's 33 English stop words; the Porter stemmer (PyStemmer's "porter", the algorithm of
Lucene's PorterStemFilter). Unicode segmentation corner cases (emoji, ideographs, Hangul) may
differ from Lucene's. Only documents sharing a term with the query are returned, as in Lucene.
"""

from __future__ import annotations

import collections
import re
from typing import Sequence

import numpy as np

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
K1, B = 0.9, 0.4
BACKENDS = ("lucene", "bm25s")
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (also bm25s's English list).
STOP_WORDS = frozenset(
  "a an and are as at be but by for if in into is it no not of on or such that the their then "
  "there these they this to was will with".split()
)

_TOKEN_RE = re.compile(
  r"[^\W_]+(?:(?:(?<=[^\W\d_])[.'’:](?=[^\W\d_])|(?<=\d)[.,;'’](?=\d)|_+)[^\W_]+)*"
)
_POSSESSIVE_RE = re.compile(r"['’][sS]$")


def document_text(product: dict) -> str:
  """The string the original indexes for `product` (see the module doc)."""
  options = product.get("options") or {}
  option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())
  bullets = product.get("BulletPoints") or [""]
  return " ".join([product["Title"], product["Description"], bullets[0], option_text]).lower()


class Analyzer:
  """Our rendering of Anserini's default English analyzer (module doc)."""

  def __init__(self):
    import Stemmer

    self._stemmer = Stemmer.Stemmer("porter")

  def __call__(self, text: str) -> list[str]:
    words = (_POSSESSIVE_RE.sub("", t).lower() for t in _TOKEN_RE.findall(text))
    return self._stemmer.stemWords([w for w in words if w and w not in STOP_WORDS])


def _int4(i: int) -> int:
  """Lucene SmallFloat.longToInt4: 4 significant bits and a 4-bit shift."""
  n = i.bit_length()
  if n < 4:
    return i
  shift = n - 4
  return ((i >> shift) & 0x07) | ((shift + 1) << 3)


def _from_int4(i: int) -> int:
  bits, shift = i & 0x07, (i >> 3) - 1
  return bits if shift == -1 else (bits | 0x08) << shift


_FREE = 255 - _int4(2**31 - 1)  # lengths stored exactly: 0..23


def lucene_length(n: int) -> int:
  """A document length as Lucene 8 decodes it from its one-byte norm (SmallFloat.intToByte4)."""
  return n if n < _FREE else _FREE + _from_int4(_int4(n - _FREE))


class SearchEngine:
  """BM25 over a catalogue's products; `search` returns asins, best first."""

  def __init__(
    self, products: Sequence[dict], backend: str = "lucene", analyzer: Analyzer | None = None
  ):
    if backend not in BACKENDS:
      raise ValueError(f"search backend={backend!r}; valid: {', '.join(BACKENDS)}")
    self.backend = backend
    self.analyzer = analyzer or Analyzer()
    self.asins = [p["asin"] for p in products]
    self._tie_rank = np.argsort(np.argsort(np.array(self.asins, dtype=object)))
    corpus = [self.analyzer(document_text(p)) for p in products]
    if backend == "bm25s":
      self._index_bm25s(corpus)
    else:
      self._index_lucene(corpus)

  def _index_lucene(self, corpus: list[list[str]]) -> None:
    from scipy import sparse

    vocab: dict[str, int] = {}
    rows, cols, vals = [], [], []
    for d, doc in enumerate(corpus):
      for term, tf in collections.Counter(doc).items():
        rows.append(d)
        cols.append(vocab.setdefault(term, len(vocab)))
        vals.append(tf)
    n = len(corpus)
    self._vocab = vocab
    self._tf = sparse.csc_matrix((vals, (rows, cols)), shape=(n, len(vocab)), dtype=np.float64)
    df = np.diff(self._tf.indptr)
    self._idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
    lengths = np.array([len(doc) for doc in corpus], np.float64)
    avgdl = lengths.mean() if n else 1.0
    stored = np.array([lucene_length(len(doc)) for doc in corpus], np.float64)
    self._norm = K1 * (1.0 - B + B * stored / max(avgdl, 1e-9))

  def _index_bm25s(self, corpus: list[list[str]]) -> None:
    import bm25s

    self._bm25 = bm25s.BM25(k1=K1, b=B, method="lucene")
    # bm25s needs one non-empty document to build its vocabulary.
    self._bm25.index(corpus if any(corpus) else [["\x00"]], show_progress=False)
    self._vocab = self._bm25.vocab_dict

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every product for `query` (float32, as Lucene scores)."""
    terms = [t for t in self.analyzer(query.lower()) if t in self._vocab]
    n = len(self.asins)
    if not terms or not n:
      return np.zeros(n, np.float32)
    if self.backend == "bm25s":
      return np.asarray(self._bm25.get_scores(terms), np.float32)[:n]
    total = np.zeros(n, np.float64)
    for term, count in collections.Counter(terms).items():
      j = self._vocab[term]
      lo, hi = self._tf.indptr[j], self._tf.indptr[j + 1]
      docs, tf = self._tf.indices[lo:hi], self._tf.data[lo:hi]
      total[docs] += count * self._idf[j] * tf / (tf + self._norm[docs])
    return total.astype(np.float32)

  def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
    """The top-k asins with a positive score; equal scores by ascending asin (Anserini)."""
    s = self.scores(query)
    hits = np.flatnonzero(s > 0)
    order = hits[np.lexsort((self._tie_rank[hits], -s[hits]))][:k]
    return [self.asins[i] for i in order]
