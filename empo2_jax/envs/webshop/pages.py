"""The pages of the WebShop site as the original text env sees them ("simple" text mode).

The original renders HTML templates and converts them with BeautifulSoup: every text node outside
head/script/style/title/meta (comments excluded, hidden elements included), whitespace-only nodes
that contain a newline dropped (BeautifulSoup reduces them to a bare newline, which the original
filters), every other node stripped and joined with ' [SEP] '. We produce the same node sequence
directly from the page data, page by page:

  search    WebShop | Instruction: | {instruction} | Search
  results   Instruction: | {instr} | Back to Search | Page {p} (Total results: {n}) | [< Prev |]
            Next > | then per product: {ASIN} | {Title} | {Price}
  item      Instruction: | {instr} | Back to Search | < Prev | per option: {name} | {values...} |
            {Title} | Price: {Price} | Rating: N.A. | Description | Features | Reviews |
            [Attributes |] Buy Now
  sub-pages Instruction: | {instr} | Back to Search | < Prev | then: the description; or each
            bullet point; or nothing (reviews: the catalogue has none); or each attribute,
            category, query, product category (attributes page, only with show_attrs)
  done      Thank you for shopping with us! | ... the hidden debug fields ... |
            Your score (min 0.0, max 1.0) | {reward} | Reward Details | None

Clickables (`Page.clickables`, lower-cased text -> what it is): the page's buttons in page order,
then product links (asins, lower-cased), then option values (-> their option name; a value shared
by two options belongs to the later one, as in the original's dict).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

SEP = " [SEP] "
SUB_PAGES = ("description", "features", "reviews", "attributes")
BUTTON_TEXT = {"description": "Description", "features": "Features", "reviews": "Reviews"}
BUTTON_TEXT["attributes"] = "Attributes"


@dataclasses.dataclass(frozen=True)
class Page:
  kind: str  # search, results, item, description, features, reviews, attributes, done
  texts: tuple[str, ...]  # the visible text nodes, stripped
  # lower-cased clickable text -> ("button", text) | ("asin", ASIN) | ("option", option name)
  clickables: dict
  has_search_bar: bool = False

  @property
  def observation(self) -> str:
    return SEP.join(self.texts)


def _nodes(*values: str) -> list[str]:
  """Text nodes as the original's converter keeps them (module doc)."""
  out = []
  for v in values:
    v = str(v)
    if not v:
      continue  # an empty template value renders no node at all
    if not v.strip() and "\n" in v:
      continue
    out.append(v.strip())
  return out


def _header(instruction: str) -> list[str]:
  return _nodes("Instruction:", instruction)


def _buttons(*texts: str) -> dict:
  return {t.lower(): ("button", t) for t in texts}


def search_page(instruction: str) -> Page:
  return Page(
    "search",
    tuple(_nodes("WebShop") + _header(instruction) + ["Search"]),
    _buttons("Search"),
    has_search_bar=True,
  )


def results_page(instruction: str, products: Sequence[dict], page: int, total: int) -> Page:
  texts = _header(instruction) + ["Back to Search", f"Page {page} (Total results: {total})"]
  nav = (["< Prev"] if page > 1 else []) + ["Next >"]
  texts += nav
  clickables = _buttons("Back to Search", *nav)
  for p in products:
    texts += _nodes(p["asin"], p["Title"], p["Price"])
    clickables[p["asin"].lower()] = ("asin", p["asin"])
  return Page("results", tuple(texts), clickables)


def item_page(instruction: str, product: dict, show_attrs: bool = False) -> Page:
  texts = _header(instruction) + ["Back to Search", "< Prev"]
  option_clicks = {}
  for name, values in product["options"].items():
    texts += _nodes(name, *values)
    for v in values:
      option_clicks[v] = ("option", name)
  subs = ["Description", "Features", "Reviews"] + (["Attributes"] if show_attrs else [])
  texts += _nodes(product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}")
  texts += subs + ["Buy Now"]
  clickables = _buttons("Back to Search", "< Prev", *subs, "Buy Now")
  clickables.update(option_clicks)
  return Page("item", tuple(texts), clickables)


def sub_page(instruction: str, product: dict, which: str) -> Page:
  texts = _header(instruction) + ["Back to Search", "< Prev"]
  if which == "description":
    texts += _nodes(product["Description"])
  elif which == "features":
    texts += _nodes(*(" " + b for b in product["BulletPoints"]))
  elif which == "attributes":
    texts += _nodes(*(" " + a for a in product["Attributes"]))
    texts += _nodes(product["category"], product["query"], product["product_category"])
  elif which != "reviews":
    raise ValueError(f"unknown sub-page {which!r}; valid: {', '.join(SUB_PAGES)}")
  return Page(which, tuple(texts), _buttons("Back to Search", "< Prev"))


def _tojson(options: dict) -> str:
  """Flask's `tojson` filter: sorted keys, ASCII, HTML-sensitive characters escaped."""
  text = json.dumps(options, sort_keys=True)
  for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
    text = text.replace(ch, esc)
  return text


def done_page(asin: str, options: dict, reward: float) -> Page:
  """The original's done page as its text env renders it: the purchase, and the debug fields the
  text env leaves unset ('None' or empty)."""
  texts = ["Thank you for shopping with us!", "Your code:", "None"]
  texts += ["(Paste it in your MTurk interface.)", "Purchased", "asin", asin]
  texts += ["options", _tojson(options), "attrs", "None", "category", "None", "query", "None"]
  texts += ["product category", "None", "Target", "asin", "options", "attrs", "price upper"]
  texts += ["instuction text", "category", "product category", "query", "Goal", "None", "Reward"]
  texts += ["Your score (min 0.0, max 1.0)", str(reward), "Reward Details", "None"]
  return Page("done", tuple(texts), {})
