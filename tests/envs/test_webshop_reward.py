"""WebShop's get_reward, branch by branch, against values computed by hand.

The type reward depends on spaCy's part-of-speech tags, so each case first asserts the nouns the
hand computation uses (the tagger's output for these titles, en_core_web_sm 3.8.0).
"""

import pytest

from empo2_jax.envs.webshop import reward as R

GOAL_NAME = "Brivo Women's Soft T-Shirt - Machine Wash, Tops & Tees"
GOAL_NOUNS = ("brivo", "women", "soft", "t", "shirt", "machine", "wash", "tops", "tees")
LONG_NAME = "Acorda Hoodie Sweatshirt Jacket Coat Vest Shirt Sweater Cardigan Blazer Parka Poncho"


def product(name="Kestrel Hoodie for Women", **kw):
  p = dict(
    name=name,
    Title=name,
    query="hoodie",
    product_category="Clothing › Men › Shirts",
    Attributes=["machine wash", "relaxed fit"],
    BulletPoints=["Soft COTTON blend", "Ribbed cuffs"],
    Description="A Breathable hoodie for every day.",
  )
  p.update(kw)
  return p


def goal(name=GOAL_NAME, **kw):
  g = dict(
    name=name,
    query="t-shirt",
    product_category="Clothing › Women › Tops",
    attributes=["machine wash"],
    goal_options=[],
    price_upper=30.0,
  )
  g.update(kw)
  return g


def test_nouns_used_by_the_hand_computations():
  assert R.nouns(GOAL_NAME) == GOAL_NOUNS
  assert R.nouns("Kestrel Hoodie for Women") == ("kestrel", "hoodie", "women")
  assert R.nouns("Brivo Hoodie for Women") == ("brivo", "hoodie", "women")
  assert len(R.nouns(LONG_NAME)) == 12
  assert R.nouns("Kestrel Vest") == ("kestrel", "vest")
  assert R.nouns("quick and easy") == ()


def test_type_reward_by_query_category_and_title():
  # 'women' is 1 of the goal's 9 nouns: title_score 1/9, in [0.1, 0.2]: r_type needs a match.
  t = R.type_reward(product(query="t-shirt"), goal())
  assert (t.r_type, t.query_match, t.category_match) == (1.0, True, False)
  assert t.title_score == pytest.approx(1 / 9)
  # Category: {'Clothing', 'Women', 'Shirts'} & {'Clothing', 'Women', 'Tops'} has 2 levels.
  t = R.type_reward(product(product_category="Clothing › Women › Shirts"), goal())
  assert (t.r_type, t.query_match, t.category_match) == (1.0, False, True)
  # One shared level is not enough; no query match: 0.5.
  assert R.type_reward(product(), goal()).r_type == 0.5
  # 'brivo' and 'women': 2/9 > 0.2 is a match by title alone.
  t = R.type_reward(product(name="Brivo Hoodie for Women"), goal())
  assert (t.r_type, t.title_score) == (1.0, pytest.approx(2 / 9))
  # 'vest' is 1 of 12 nouns (< 0.1): 0.1 even with the query matching.
  t = R.type_reward(product(name="Kestrel Vest", query="t-shirt"), goal(name=LONG_NAME))
  assert (t.r_type, t.title_score) == (0.1, pytest.approx(1 / 12))
  # No shared noun: 0.0, whatever else matches.
  t = R.type_reward(product(name="Kestrel Vest", query="t-shirt"), goal())
  assert (t.r_type, t.title_score) == (0.0, 0.0)
  # A goal title without nouns scores 0.2: not > 0.2, so 0.5 unless the query/category match.
  assert R.type_reward(product(), goal(name="quick and easy")).r_type == 0.5
  assert R.type_reward(product(query="t-shirt"), goal(name="quick and easy")).r_type == 1.0


def test_attribute_matches_fuzzy_then_title_bullets_description():
  p = product(name="Kestrel Long Sleeve Hoodie", Title="Kestrel Long Sleeve Hoodie")
  # token_set_ratio('machine wash', 'machine washable') = round(100 * 2*12/28) = 86 > 85.
  assert R.fuzz.token_set_ratio("machine wash", "machine washable") == 86
  assert R.attribute_matches(p, ["machine washable"]) == 1
  # 'relaxed fitting' vs 'relaxed fit': round(100 * 2*11/26) = 85, not > 85; in no text either.
  assert R.fuzz.token_set_ratio("relaxed fit", "relaxed fitting") == 85
  assert R.attribute_matches(p, ["relaxed fitting"]) == 0
  assert R.attribute_matches(p, ["long sleeve"]) == 1  # lower-cased title
  assert R.attribute_matches(p, ["cotton"]) == 1  # bullet points
  assert R.attribute_matches(p, ["breathable"]) == 1  # description
  assert R.attribute_matches(p, ["waterproof"]) == 0
  assert R.attribute_matches(p, ["machine washable", "cotton", "waterproof", "long sleeve"]) == 3


def test_options_with_colour_normalisation():
  # 'navy blue | white' -> 'blue' (the first colour of the list it contains); 'x-large' holds the
  # token 'large'; nothing selected is red.
  assert R.normalize_color("navy blue | white") == "blue"
  assert R.normalize_color("x-large") == "x-large"
  selected = ["navy blue | white", "x-large"]
  assert R.option_matches(selected, ["blue", "large", "red"]) == 2
  assert R.option_matches(selected, []) == 0


def test_synthetic_goal_options_are_name_value_tuples():
  g = goal(goal_options={"size": "large", "color": "black"})
  items = R.goal_option_items(g)
  assert items == [("size", "large"), ("color", "black")]
  # A tuple is normalised only when an element IS a colour word.
  assert R.normalize_color(("color", "black")) == "black"
  assert R.normalize_color(("color", "jet black")) == ("color", "jet black")
  # thefuzz reads the tuple as "size large": 'large' scores 100, 'x-large' only 83 ...
  assert R.fuzz.token_set_ratio("large", ("size", "large")) == 100
  assert R.fuzz.token_set_ratio("x-large", ("size", "large")) == 83
  assert R.option_matches(["large", "white"], items) == 1
  assert R.option_matches(["x-large"], items) == 0
  # ... whereas against the plain value (a human goal) 'x-large' matches 'large'.
  assert R.option_matches(["x-large"], ["large"]) == 1


def test_get_reward_total():
  p = product(name="Brivo Hoodie for Women", Title="Brivo Hoodie for Women")
  g = goal(attributes=["machine wash", "cotton", "waterproof"], goal_options=["blue", "large"])
  options = {"color": "navy blue", "size": "small"}
  r = R.get_reward(p, g, price=25.0, options=options)
  # r_type 1 (title 2/9); attributes 2 of 3, options 1 of 2, price 1: (2 + 1 + 1) / (3 + 2 + 1).
  assert (r.r_type, r.attribute_matches, r.option_matches, r.price_ok) == (1.0, 2, 1, True)
  assert r.total == pytest.approx(4 / 6)
  r = R.get_reward(p, g, price=30.01, options=options)
  assert (r.price_ok, r.total) == (False, pytest.approx(3 / 6))
  # The same purchase when the type only half matches (title 1/9, no query/category match).
  p2 = product(Title="Brivo Hoodie for Women")
  assert R.get_reward(p2, g, price=25.0, options=options).total == pytest.approx(0.5 * 4 / 6)
  # The price limit is inclusive.
  assert R.get_reward(p, g, price=30.0, options=options).price_ok
