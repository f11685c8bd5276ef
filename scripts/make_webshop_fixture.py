"""Writes the bundled WebShop fixture: a small made-up catalogue in the original file formats.

  python scripts/make_webshop_fixture.py [--out empo2_jax/envs/webshop/fixture] [--seed 0]

Files (the formats of the original WebShop data, see empo2_jax/envs/webshop/data.py):
  items_shuffle.json    JSON list of scraped-style product records
  items_ins_v2.json     asin -> {attributes, instruction, instruction_attributes}
  items_human_ins.json  asin -> [{instruction, instruction_attributes, instruction_options}]

Six departments, each with product types, attribute words, option sets and instruction phrasings;
everything is drawn from one seeded generator, so the output is byte-identical for a seed. The
records also carry the irregularities the loader must handle as the original does: a repeated
asin, an asin 'nan', an over-long asin, a string small_description, a missing price, price
ranges, an option value with '/', a None option list, products without attribute records (->
DUMMY_ATTR), attribute records without an instruction, human instructions without attributes,
goal attributes found only in the title or description, and a product too expensive for a price
limit. Every product name, brand and text is invented.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[1] / "empo2_jax/envs/webshop/fixture"
BRANDS = (
  "Acorda Brivo Calvena Dunmore Elsway Fenwick Galloway Harlow Istra Juniper Kestrel Lumen "
  "Marlow Norvik Oakhurst Pellam Quillon Rowan Sable Tamsin Umber Vantor Wexley Yarrow Zephra"
).split()
COLORS = (
  "black",
  "white",
  "navy blue",
  "heather grey",
  "burgundy",
  "olive green",
  "light pink",
  "Black/White",
  "royal blue",
  "beige",
)

# department: (breadcrumb, types [(noun phrase, query)], attributes, title words, options)
DEPARTMENTS = {
  "clothing": (
    "Clothing, Shoes & Jewelry › {who} › Clothing › {kind}",
    [("t-shirt", "Tops & Tees"), ("hoodie", "Fashion Hoodies"), ("leggings", "Leggings")]
    + [("dress", "Dresses"), ("jacket", "Coats & Jackets"), ("sweater", "Sweaters")],
    "machine wash|long sleeve|short sleeve|relaxed fit|polyester spandex|button closure|"
    "drawstring closure|elastic waistband|hand wash|quality materials",
    "Cotton|Soft|Casual|Lightweight|Classic|Stretch",
    {"color": COLORS, "size": ("small", "medium", "large", "x-large", "xx-large")},
  ),
  "shoes": (
    "Clothing, Shoes & Jewelry › {who} › Shoes › {kind}",
    [("running shoes", "Athletic"), ("sandals", "Sandals"), ("ankle boots", "Boots")]
    + [("sneakers", "Fashion Sneakers"), ("slippers", "Slippers")],
    "rubber sole|non slip|memory foam|lace up|arch support|anti slip|quick drying|breathable mesh",
    "Walking|Comfort|Outdoor|Trail|Everyday",
    {"color": COLORS[:7], "size": ("6", "7", "7.5", "8", "9", "10", "11")},
  ),
  "beauty": (
    "Beauty & Personal Care › {kind} › {who}",
    [("shampoo", "Hair Care"), ("face moisturizer", "Skin Care"), ("lipstick", "Makeup")]
    + [("hair oil", "Hair Care"), ("body lotion", "Skin Care"), ("nail polish", "Nail Care")],
    "paraben free|sulfate free|cruelty free|natural ingredients|long lasting|easy apply|"
    "dry skin|sensitive skin|hyaluronic acid|fine lines",
    "Hydrating|Nourishing|Gentle|Daily|Repair",
    {"scent": ("lavender", "coconut", "unscented"), "size": ("8 fl oz", "16 fl oz", "3.4 ounce")},
  ),
  "grocery": (
    "Grocery & Gourmet Food › {kind} › {who}",
    [("coffee beans", "Beverages"), ("green tea", "Beverages"), ("protein bars", "Snacks")]
    + [("granola", "Breakfast"), ("dark chocolate", "Candy"), ("beef jerky", "Snacks")],
    "gluten free|non gmo|low sugar|high protein|usda organic|keto friendly|individually wrapped|"
    "natural flavors|low calorie|dairy free",
    "Organic|Roasted|Crunchy|Premium|Classic",
    {
      "flavor name": ("vanilla", "sea salt caramel", "original"),
      "size": ("pack of 1", "pack of 3"),
    },
  ),
  "home": (
    "Home & Kitchen › Furniture › {kind} › {who}",
    [("bookshelf", "Bookcases"), ("office chair", "Chairs"), ("coffee table", "Tables")]
    + [("bed frame", "Beds"), ("throw pillow covers", "Decor"), ("area rug", "Rugs")],
    "easy assemble|solid wood|wood finish|living room|high density|non slip|metal legs|"
    "easy clean|storage space|mid century",
    "Modern|Rustic|Compact|Farmhouse|Minimalist",
    {"color": COLORS[:6], "size": ("twin", "queen", "king", "18 x 18 inch")},
  ),
  "electronics": (
    "Electronics › {kind} › {who}",
    [("wireless earbuds", "Headphones"), ("phone case", "Cell Phone Accessories")]
    + [("usb c cable", "Cables"), ("bluetooth speaker", "Speakers"), ("power bank", "Chargers")],
    "fast charging|high definition|easy install|long lasting|noise cancelling|water resistant|"
    "usb port|plug play|high speed|heavy duty",
    "Portable|Wireless|Compact|Rugged|Slim",
    {"color": COLORS[:5], "style": ("2 pack", "6 ft", "10 ft")},
  ),
}
WHO = ("Women", "Men", "Unisex", "Kids")
SYN_TEMPLATES = (
  "i need a {t} that is {a}",
  "i am looking for {t} which is {a}",
  "find me a {t}, {a}",
  "i want {t} that are {a}",
)
HUMAN_TEMPLATES = (
  "I'm looking for a {t} that is {a}.",
  "Looking for {t}, {a}, in {o}.",
  "I want to buy {t} which are {a} and in {o}.",
)


def _asin(rng: random.Random) -> str:
  return "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))


def _price(rng: random.Random) -> str | None:
  u = rng.random()
  if u < 0.04:
    return None
  low = round(rng.uniform(4, 90), 2)
  if u < 0.25:
    return f"${low:.2f} - ${low + rng.choice((3, 5, 10, 20)):.2f}"
  return f"${low:.2f}"


def make_product(rng: random.Random, dept: str, asin: str) -> tuple[dict, dict]:
  crumb, types, attrs, words, option_sets = DEPARTMENTS[dept]
  noun, kind = rng.choice(types)
  who = rng.choice(WHO)
  brand = rng.choice(BRANDS)
  attributes = rng.sample(attrs.split("|"), rng.randint(2, 5))
  word = rng.choice(words.split("|"))
  poss = f"{who}'s " if who in ("Women", "Men") else ""
  title = f"{brand} {poss}{word} {noun.title()} - {attributes[0].title()}, {kind}"
  query = f"{poss.lower()}{noun}"
  options = {}
  for name in rng.sample(sorted(option_sets), rng.choice((0, 1, 1, 2, 2, 2))):
    values = rng.sample(option_sets[name], rng.randint(2, min(4, len(option_sets[name]))))
    options[name] = [{"value": v, "image": f"images/{asin}_{i}.jpg"} for i, v in enumerate(values)]
  description = (
    f"The {brand} {noun} is made for {who.lower()} who want {word.lower()} comfort every day. "
    f"It is {attributes[-1]} and built to last, with a {rng.choice(('simple', 'clean'))} design."
  )
  bullets = [f"{a.capitalize()}: designed with care" for a in attributes[:3]]
  bullets.append(f"{word} {noun} from {brand}")
  record = {
    "asin": asin,
    "name": title,
    "full_description": description,
    "small_description": bullets,
    "pricing": _price(rng),
    "images": [f"images/{asin}.jpg"],
    "category": dept,
    "query": query,
    "product_category": crumb.format(who=who, kind=kind),
    "customization_options": options or None,
    "brand": brand,  # dropped by the loader, as the original drops it
    "total_reviews": rng.randint(0, 500),
  }
  # Goal attributes: from the product's attributes, sometimes a title or description word that
  # is not among them (the reward's fallback to title/description).
  goal_attrs = rng.sample(attributes, rng.randint(1, min(3, len(attributes))))
  if rng.random() < 0.2:
    goal_attrs.append(word.lower())  # in the title, not in the attribute list
  ins = {"attributes": attributes, "instruction_attributes": goal_attrs}
  ins["instruction"] = rng.choice(SYN_TEMPLATES).format(t=noun, a=" and ".join(goal_attrs))
  return record, ins


def make_human(rng: random.Random, record: dict, ins: dict) -> dict:
  noun = record["query"].split("'s ")[-1]
  options = (record["customization_options"] or {}).values()
  chosen = [rng.choice(v)["value"].lower() for v in options if v]
  attrs = ins["instruction_attributes"][:2]
  template = HUMAN_TEMPLATES[0] if not chosen else rng.choice(HUMAN_TEMPLATES[1:])
  text = template.format(t=noun, a=" and ".join(attrs), o=" ".join(chosen))
  return {"instruction": text, "instruction_attributes": attrs, "instruction_options": chosen}


def build(seed: int = 0, n_products: int = 240) -> tuple[list, dict, dict]:
  rng = random.Random(seed)
  products, attrs, human = [], {}, {}
  depts = sorted(DEPARTMENTS)
  for i in range(n_products):
    asin = _asin(rng)
    record, ins = make_product(rng, depts[i % len(depts)], asin)
    if i == 1:
      record["small_description"] = "A single bullet given as a string"
    elif i == 2:
      record["pricing"] = "$985.00"  # no price limit: fewer than two tens above it
    elif i == 3:  # a value with '/', shown as 'red | blue'; a None option list is skipped
      record["customization_options"] = {"Color": [{"value": "Red/Blue", "image": None}]}
      record["customization_options"]["Size"] = None
    products.append(record)
    if i % 17 == 5:
      continue  # no attribute record: Attributes = ['DUMMY_ATTR'], no synthetic goal
    if i % 19 == 7:
      ins.pop("instruction")  # attributes only: no synthetic goal
    attrs[asin] = ins
    if "instruction" in ins and i % 3 != 2:
      human[asin] = [make_human(rng, record, ins)]
      if i % 7 == 0:  # a human record without attributes: skipped by the goal builder
        human[asin].append({"instruction": "Anything nice.", "instruction_attributes": []})
  # Repeated and invalid asins, skipped by the loader as by the original.
  products.append(dict(products[0], name="A repeated asin: the loader keeps the first record"))
  products.append(dict(products[4], asin="nan"))
  products.append(dict(products[5], asin="B0TOOLONGASIN"))
  return products, attrs, human


def _dump_lines(items) -> str:
  return "[\n" + ",\n".join(json.dumps(x, ensure_ascii=False) for x in items) + "\n]\n"


def _dump_dict(d: dict) -> str:
  rows = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in d.items()]
  return "{\n" + ",\n".join(rows) + "\n}\n"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=str(DEFAULT_OUT))
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--products", type=int, default=240)
  args = ap.parse_args()
  products, attrs, human = build(args.seed, args.products)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "items_shuffle.json").write_text(_dump_lines(products))
  (out / "items_ins_v2.json").write_text(_dump_dict(attrs))
  (out / "items_human_ins.json").write_text(_dump_dict(human))
  sizes = {p.name: p.stat().st_size for p in sorted(out.glob("*.json"))}
  print(f"wrote {len(products)} product records to {out}: {sizes}")


if __name__ == "__main__":
  main()
