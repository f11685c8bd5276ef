"""WebShop product data in the original file formats: loading, cleaning, sampled prices, goals.

A data directory (local or gs://, read through etils.epath) holds the original files:

  items_shuffle_1000.json | items_shuffle.json     JSON list of scraped products
  items_ins_v2_1000.json  | items_ins_v2.json      JSON dict asin -> {attributes, instruction,
                                                   instruction_attributes}
  items_human_ins.json                             JSON dict asin -> [human instruction records]
                                                   (only needed for human goals)

`resolve_files` picks the 1000-product pair when it is there (verl-agent's default `use_small`),
else the full pair, else the only `items_shuffle*.json` / `items_ins_v2*.json` with the same suffix.

Products are cleaned as the original `load_products` does: skip asin 'nan' or longer than 10
characters and repeated asins; Title/Description/BulletPoints from name/full_description/
small_description; pricing parsed from the '$' amounts (first two kept, none -> [100.0]) and shown
as "$a" or "$a to $b" (Python's float formatting, so "$100.0"); options lower-cased with '/' shown
as ' | '; Attributes from the instruction file (missing -> ['DUMMY_ATTR']); query lower-cased and
stripped; reviews empty, rating 'N.A.'. Keys the original drops are dropped.

Prices and goals (the original `generate_product_prices` and `goal.py`): a product with a price
range gets one price drawn uniformly inside it; a goal's price limit is the larger of two values
drawn from the first four multiples of 10 above that price (none and no limit text when fewer than
two exist). The original draws both from Python's unseeded global generator, so they change from
run to run; here one `random.Random(price_seed)` makes the same draws in the same order, so a
catalogue is reproducible. Then the goals are shuffled with `random.Random(233)` exactly as the
original's `random.seed(233); random.shuffle(goals)`.

Splits (our choice, the original WebShop convention on the shuffled list): test = the first
`num_test` goals (500), dev = the next `num_dev` (0 by default; the original IL baselines used
1,000), train = all the rest. verl-agent (used by GiGPO) differs: each of its env workers seeds
`random` with its own worker seed before loading and shuffles with that seed instead of 233, so
"goal k" is a different goal (and price limit) on every worker and its 500 "test" indices are a
per-worker random subset. We keep one global list so that a goal index means the same goal
everywhere (train and test never overlap).
"""

from __future__ import annotations

import dataclasses
import decimal
import itertools
import json
import random
import re
from collections import defaultdict
from typing import Any

from etils import epath

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_LIMIT = 1000000
SHUFFLE_SEED = 233
DUMMY_ATTR = "DUMMY_ATTR"
GOAL_MODES = ("synthetic", "human")
# Keys of the scraped records the original deletes before use.
DROPPED_KEYS = (
  "product_information",
  "brand",
  "brand_url",
  "list_price",
  "availability_quantity",
  "availability_status",
  "total_reviews",
  "total_answered_questions",
  "seller_id",
  "seller_name",
  "fulfilled_by_amazon",
  "fast_track_message",
  "aplus_present",
  "small_description_old",
)
HUMAN_FILE = "items_human_ins.json"


@dataclasses.dataclass(frozen=True)
class DataFiles:
  products: epath.Path
  attributes: epath.Path
  human: epath.Path | None  # None when the directory has no items_human_ins.json


def resolve_files(data_dir) -> DataFiles:
  """The product, attribute and human-instruction files of `data_dir` (see the module doc)."""
  root = epath.Path(data_dir)
  if not root.is_dir():
    raise FileNotFoundError(
      f"WebShop data directory {str(root)!r} does not exist. It must hold the original "
      "items_shuffle*.json and items_ins_v2*.json (and items_human_ins.json for human goals)."
    )
  pairs = [("items_shuffle_1000.json", "items_ins_v2_1000.json")]
  pairs.append(("items_shuffle.json", "items_ins_v2.json"))
  for shuffle in sorted(p.name for p in root.glob("items_shuffle*.json")):
    suffix = shuffle[len("items_shuffle") :]
    pairs.append((shuffle, f"items_ins_v2{suffix}"))
  for prod, attr in pairs:
    if (root / prod).exists() and (root / attr).exists():
      human = root / HUMAN_FILE
      return DataFiles(root / prod, root / attr, human if human.exists() else None)
  found = sorted(p.name for p in root.glob("*.json"))
  raise FileNotFoundError(
    f"No items_shuffle*.json with a matching items_ins_v2*.json in {str(root)!r} (found: "
    f"{', '.join(found) or 'no JSON files'}). Expected e.g. items_shuffle_1000.json + "
    "items_ins_v2_1000.json, or items_shuffle.json + items_ins_v2.json."
  )


def read_json(path) -> Any:
  return json.loads(epath.Path(path).read_text())


def parse_pricing(pricing) -> tuple[list[float], str]:
  """(prices, display) of a scraped pricing string such as '$12.99' or '$10.99 - $15.49'."""
  if not pricing:
    return [100.0], "$100.0"
  values = []
  for piece in str(pricing).split("$")[1:]:
    digits = re.sub(r"[^\d.]", "", piece)
    if digits:  # the original would raise on an empty amount; we skip it
      values.append(float(decimal.Decimal(digits)))
  if not values:
    return [100.0], "$100.0"
  if len(values) == 1:
    return values, f"${values[0]}"
  return values[:2], f"${values[0]} to ${values[1]}"


def clean_product(raw: dict, attributes: dict) -> dict:
  """One product as the original env sees it (fields named in the module doc)."""
  p = {k: v for k, v in raw.items() if k not in DROPPED_KEYS}
  asin = p["asin"]
  p["category"] = p.get("category") or ""
  p["query"] = (p.get("query") or "").lower().strip()
  p["product_category"] = p.get("product_category") or ""
  p["Title"] = p.get("name") or ""
  p["name"] = p["Title"]
  p["Description"] = p.get("full_description") or ""
  bullets = p.get("small_description")
  if isinstance(bullets, list):
    p["BulletPoints"] = [b for b in bullets if isinstance(b, str)]
  else:
    p["BulletPoints"] = [bullets] if isinstance(bullets, str) else []
  p["Reviews"] = []
  p["Rating"] = "N.A."
  p["pricing"], p["Price"] = parse_pricing(p.get("pricing"))
  options: dict[str, list[str]] = {}
  for name, contents in (p.get("customization_options") or {}).items():
    if contents is None:
      continue
    options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
  p["options"] = options
  record = attributes.get(asin) or {}
  p["Attributes"] = list(record["attributes"]) if "attributes" in record else [DUMMY_ATTR]
  p["instruction_text"] = record.get("instruction")
  p["instruction_attributes"] = record.get("instruction_attributes")
  images = p.get("images") or [""]
  p["MainImage"] = images[0]
  return p


def clean_products(raw_products: list, attributes: dict, num_products: int | None = None) -> list:
  """Valid, de-duplicated products in file order (optionally the first `num_products` records)."""
  if num_products is not None:
    raw_products = raw_products[:num_products]
  seen, out = set(), []
  for raw in raw_products:
    asin = raw.get("asin")
    if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
      continue
    seen.add(asin)
    out.append(clean_product(raw, attributes))
  return out


def sample_prices(products: list, rng: random.Random) -> dict[str, float]:
  """asin -> the price used by the reward: the only price, or uniform inside a price range."""
  prices = {}
  for p in products:
    pricing = p["pricing"]
    prices[p["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
  return prices


def price_limit(price: float, rng: random.Random) -> tuple[float, str]:
  """(price_upper, instruction suffix) for a goal whose product costs `price`."""
  cands = [x for x in PRICE_RANGE if x > price][:4]
  if len(cands) >= 2:
    upper = sorted(rng.sample(cands, 2))[1]
    return upper, f", and price lower than {upper:.2f} dollars"
  return NO_PRICE_LIMIT, ""


def _goal(p: dict, text: str, attributes: list, upper: float, options) -> dict:
  return {
    "asin": p["asin"],
    "category": p["category"],
    "query": p["query"],
    "name": p["Title"],
    "product_category": p["product_category"],
    "instruction_text": text,
    "attributes": list(attributes),
    "price_upper": upper,
    "goal_options": options,
  }


def human_goals(products: list, human: dict, prices: dict, rng: random.Random) -> list[dict]:
  """One goal per human instruction with attributes (goal_options: a list of values)."""
  goals = []
  for p in products:
    for rec in human.get(p["asin"], ()):
      attributes = rec.get("instruction_attributes") or []
      if not attributes:
        continue
      upper, suffix = price_limit(prices[p["asin"]], rng)
      text = rec["instruction"].strip(".") + suffix
      goals.append(_goal(p, text, attributes, upper, list(rec.get("instruction_options") or [])))
  for g in goals:
    g["weight"] = 1
  return goals


def synthetic_goals(products: list, prices: dict, rng: random.Random) -> list[dict]:
  """One goal per option combination of every product with a synthetic instruction
  (goal_options: a dict option name -> value)."""
  goals, counts = [], defaultdict(int)
  for p in products:
    if p.get("instruction_text") is None:
      continue
    attributes = p["instruction_attributes"] or []
    if not attributes:
      raise ValueError(f"product {p['asin']}: a synthetic instruction without attributes")
    upper, suffix = price_limit(prices[p["asin"]], rng)
    names = sorted(p["options"])
    for combo in itertools.product(*(p["options"][n] for n in names)):
      options = dict(zip(names, combo))
      with_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
      with_text = " with " + with_text if with_text else ""
      text = f"{p['instruction_text']}{with_text}{suffix}"
      goals.append(_goal(p, text, attributes, upper, options))
      for a in attributes:
        counts[a] += 1
  for g in goals:
    g["weight"] = sum(1.0 / counts[a] for a in g["attributes"]) / len(g["attributes"])
  return goals


@dataclasses.dataclass
class Catalog:
  products: list  # cleaned product dicts, file order
  by_asin: dict  # asin -> product
  prices: dict  # asin -> sampled price (the reward's)
  goals: list  # after the seed-233 shuffle
  files: DataFiles | None = None

  def split_indices(self, split: str, num_test: int, num_dev: int) -> list[int]:
    n = len(self.goals)
    bounds = {
      "test": (0, min(num_test, n)),
      "dev": (min(num_test, n), min(num_test + num_dev, n)),
      "train": (min(num_test + num_dev, n), n),
    }
    lo, hi = bounds[split]
    return list(range(lo, hi))


def build_catalog(
  raw_products: list,
  attributes: dict,
  human: dict | None,
  *,
  goals: str = "synthetic",
  price_seed: int = 0,
  num_products: int | None = None,
  files: DataFiles | None = None,
) -> Catalog:
  if goals not in GOAL_MODES:
    raise ValueError(f"goals={goals!r}; valid: {', '.join(GOAL_MODES)}")
  products = clean_products(raw_products, attributes, num_products)
  rng = random.Random(price_seed)
  prices = sample_prices(products, rng)
  if goals == "human":
    if human is None:
      raise FileNotFoundError(f"human goals need {HUMAN_FILE} in the WebShop data directory")
    goal_list = human_goals(products, human, prices, rng)
  else:
    goal_list = synthetic_goals(products, prices, rng)
  random.Random(SHUFFLE_SEED).shuffle(goal_list)
  return Catalog(products, {p["asin"]: p for p in products}, prices, goal_list, files)


def load_catalog(
  data_dir, *, goals: str = "synthetic", price_seed: int = 0, num_products: int | None = None
) -> Catalog:
  """The catalogue of an original-format data directory (local or gs://)."""
  files = resolve_files(data_dir)
  human = read_json(files.human) if goals == "human" and files.human is not None else None
  return build_catalog(
    read_json(files.products),
    read_json(files.attributes),
    human,
    goals=goals,
    price_seed=price_seed,
    num_products=num_products,
    files=files,
  )
