"""WebShop env: the bundled fixture, page observations and clickables in the original's format,
click routing, action parsing, step limit, rewards, and loading an original-format directory."""

import json
import os

import pytest

from empo2_jax.envs.base import TextEnv
from empo2_jax.envs.webshop import data as data_lib
from empo2_jax.envs.webshop.env import WebShopConfig, WebShopEnv, extract_action, parse_action
from empo2_jax.envs.webshop.search import document_text

TASK = "webshop"


@pytest.fixture(scope="module")
def env():
  return WebShopEnv()


def _goal_with_options(env, n_options=2):
  for i in env.variations(TASK, "test"):
    if len(env.catalog.goals[i]["goal_options"]) == n_options:
      return i
  raise AssertionError("no such goal in the fixture")


def test_fixture_catalogue_and_splits(env):
  assert isinstance(env, TextEnv)
  c = env.catalog
  # 243 records: one repeated asin, one 'nan', one too long are skipped.
  assert len(c.products) == 240
  assert len(c.goals) == 1045
  test, train = env.variations(TASK, "test"), env.variations(TASK, "train")
  assert test == list(range(500)) and train == list(range(500, 1045))
  assert env.variations(TASK, "dev") == []
  dev = WebShopEnv(WebShopConfig(num_dev=100, num_train_variations=3, num_test_variations=2))
  assert dev.variations(TASK, "dev") == list(range(500, 600))
  assert dev.variations(TASK, "train") == list(range(600, 1045))
  assert dev.used_variations(TASK, "train") == [600, 601, 602] and dev.used_variations(
    TASK, "test"
  ) == [0, 1]
  assert dev.used_variations(TASK, "dev") == list(range(500, 600))  # 0 rows: the whole split
  with pytest.raises(ValueError, match="Valid tasks: webshop"):
    env.variations("shop", "test")


def test_reset_shows_the_search_page(env):
  obs, info = env.reset(TASK, 3)
  instr = env.catalog.goals[3]["instruction_text"]
  assert obs == f"WebShop [SEP] Instruction: [SEP] {instr} [SEP] Search"
  assert info.task_description == instr and info.max_steps == 15
  assert env.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
  with pytest.raises(ValueError, match=r"out of range \(0..1044\)"):
    env.reset(TASK, 1045)


def test_results_item_and_sub_pages(env):
  gi = _goal_with_options(env)
  g = env.catalog.goals[gi]
  instr = g["instruction_text"]
  env.reset(TASK, gi)
  hits = env.engine.search(g["query"])
  obs, reward, done, info = env.step(f"search[{g['query']}]")
  assert (reward, done, info.valid, info.page) == (0.0, False, True, "results")
  shown = [env.catalog.by_asin[a] for a in hits[:10]]
  head = f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] Page 1 (Total results: {len(hits)}"
  head += ")"
  body = " [SEP] ".join(f"{p['asin']} [SEP] {p['Title']} [SEP] {p['Price']}" for p in shown)
  assert obs == f"{head} [SEP] Next > [SEP] {body}"
  assert list(info.clickables) == ["back to search", "next >"] + [p["asin"].lower() for p in shown]
  obs, *_ = env.step("click[next >]")
  page2 = "".join(
    f" [SEP] {a} [SEP] {env.catalog.by_asin[a]['Title']} [SEP] {env.catalog.by_asin[a]['Price']}"
    for a in hits[10:20]
  )
  head = head.replace("Page 1", "Page 2")
  assert obs == f"{head} [SEP] < Prev [SEP] Next >{page2}"
  env.step("click[< prev]")
  # The item page of the goal product.
  p = env.catalog.by_asin[g["asin"]]
  if g["asin"].lower() not in env.page.clickables:
    env.step("click[next >]")
  obs, _, _, info = env.step(f"click[{g['asin'].lower()}]")
  opts = " [SEP] ".join(f"{k} [SEP] " + " [SEP] ".join(v) for k, v in p["options"].items())
  assert obs == (
    f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] < Prev [SEP] {opts} [SEP] "
    f"{p['Title']} [SEP] Price: {p['Price']} [SEP] Rating: N.A. [SEP] Description [SEP] "
    "Features [SEP] Reviews [SEP] Buy Now"
  )
  buttons = ["back to search", "< prev", "description", "features", "reviews", "buy now"]
  assert list(info.clickables) == buttons + [v for vs in p["options"].values() for v in vs]
  # Selecting an option does not change the text; sub-pages and back.
  value = next(iter(p["options"].values()))[0]
  assert env.step(f"click[{value}]")[0] == obs
  sub = f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] < Prev"
  assert env.step("click[description]")[0] == f"{sub} [SEP] {p['Description']}"
  assert env.step("click[< prev]")[0] == obs
  assert env.step("click[features]")[0] == sub + "".join(f" [SEP] {b}" for b in p["BulletPoints"])
  env.step("click[< prev]")
  obs, _, _, info = env.step("click[reviews]")
  assert (obs, list(info.clickables)) == (sub, ["back to search", "< prev"])
  env.step("click[< prev]")
  # < Prev on an item page: the results page again; Back to Search: the start page.
  assert env.step("click[< prev]")[3].page == "results"
  assert env.step("click[back to search]")[0].startswith("WebShop [SEP] Instruction:")


def test_invalid_actions_are_no_ops_and_the_step_limit(env):
  env.reset(TASK, 0)
  start = env.page.observation
  for text in ("click[search]", "click[buy now]", "jump", "search[]", "click[b000000000]"):
    obs, reward, done, info = env.step(text)
    assert (obs, reward, done, info.valid) == (start, 0.0, False, False), text
  env = WebShopEnv(WebShopConfig(max_steps=2))
  env.reset(TASK, 0)
  assert env.step("search[shoes]")[2] is False
  obs, reward, done, info = env.step("click[back to search]")
  assert (done, info.truncated, info.success, reward) == (True, True, False, 0.0)
  with pytest.raises(RuntimeError, match="over"):
    env.step("search[shoes]")


def test_action_parsing():
  assert extract_action("  Search[Red Shoes] ") == "search[red shoes]"
  assert extract_action("<think>x</think><action>click[Buy Now]</action>") == "click[buy now]"
  assert extract_action("I will search.\nsearch[tea]\nthen buy") == "search[tea]"
  assert parse_action("click[< prev]") == ("click", "< prev")
  assert parse_action("search") == ("search", None)


def _buy(env, gi, values):
  g = env.catalog.goals[gi]
  env.reset(TASK, gi)
  env.step(f"search[{g['query']}]")
  for _ in range(4):
    if g["asin"].lower() in env.page.clickables:
      break
    env.step("click[next >]")
  env.step(f"click[{g['asin'].lower()}]")
  for v in values:
    assert env.step(f"click[{v}]")[3].valid
  return env.step("click[buy now]")


@pytest.mark.slow  # ~4 s of steps and noun tagging, plus loading spaCy when it runs first
def test_oracle_scores_one_on_every_test_goal(env):
  """Search the goal's query, open the goal product, pick the goal options, buy."""
  for gi in env.variations(TASK, "test"):
    g = env.catalog.goals[gi]
    obs, reward, done, info = _buy(env, gi, list(g["goal_options"].values()))
    assert (done, info.raw_reward, info.success, reward) == (True, 1.0, True, 100.0), gi
    assert info.score == 100.0 and info.purchased == g["asin"]
    assert obs.startswith("Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] ")
    assert obs.endswith("Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP] Reward Details [SEP] None")
    assert f"[SEP] asin [SEP] {g['asin']} [SEP] options [SEP] " in obs


def test_wrong_product_or_options_score_less(env):
  gi = _goal_with_options(env)
  g = env.catalog.goals[gi]
  p = env.catalog.by_asin[g["asin"]]
  # Other values for every option, token-disjoint from the goal's (so no fuzzy match).
  others = []
  for name, value in g["goal_options"].items():
    words = set(value.split())
    others.append(next(v for v in p["options"][name] if not set(v.split()) & words))
  _, reward, _, info = _buy(env, gi, others)
  n_attr = len(g["attributes"])
  assert info.raw_reward == pytest.approx((n_attr + 1) / (n_attr + 2 + 1))
  assert not info.success
  # A different product from the results: less than 1.
  env.reset(TASK, gi)
  env.step(f"search[{g['query']}]")
  other = next(a for a in env.page.clickables if len(a) == 10 and a != g["asin"].lower())
  env.step(f"click[{other}]")
  assert env.step("click[buy now]")[3].raw_reward < 1.0


def test_reward_modes(env):
  gi = 0
  values = list(env.catalog.goals[gi]["goal_options"].values())
  for mode, expected in (("verl", 10.0), ("raw", 1.0), ("score", 100.0)):
    e = WebShopEnv(WebShopConfig(reward_mode=mode))
    _, reward, _, info = _buy(e, gi, values)
    assert (reward, info.score, info.raw_reward) == (expected, expected, 1.0)
  with pytest.raises(ValueError, match="valid: score, verl, raw"):
    WebShopConfig(reward_mode="ten")


def test_agent_observation_is_verl_agents_view():
  env = WebShopEnv(WebShopConfig(observation="agent"))
  obs, _ = env.reset(TASK, 0)
  assert obs == (
    "'Search'\nYour admissible actions of the current situation are:\n"
    "[\n'search[<your query>]',\n'click[search]',\n]"
  )
  obs, *_ = env.step("search[tea]")
  page, actions = obs.split("\nYour admissible actions of the current situation are:\n")
  assert page.startswith("'Back to Search' [SEP] 'Page 1 (Total results: ")
  assert actions.startswith("[\n'click[back to search]',\n'click[next >]',\n'click[b0")


def test_loading_an_original_format_directory(tmp_path):
  """Records written the way the original files are, read back with the original's cleaning."""
  products = [
    {
      "asin": "B000000001",
      "name": "Kestrel Green Tea",
      "full_description": "Loose leaf green tea.",
      "small_description": "Smooth and fresh",
      "pricing": "$10.00 - $12.00",
      "images": ["x.jpg"],
      "category": "grocery",
      "query": " Green Tea ",
      "product_category": "Grocery › Beverages › Tea",
      "customization_options": {"Size": [{"value": "Pack of 2/3", "image": None}], "X": None},
      "brand": "Kestrel",
    },
    {"asin": "nan", "name": "skipped"},
    {
      "asin": "B000000002",
      "name": "Pellam Black Tea",
      "full_description": "Black tea.",
      "small_description": ["Strong"],
      "images": ["y.jpg"],
      "category": "grocery",
      "query": "black tea",
      "product_category": "Grocery › Beverages › Tea",
      "customization_options": None,
    },
  ]
  attrs = {
    "B000000001": {
      "attributes": ["loose leaf"],
      "instruction": "i need green tea",
      "instruction_attributes": ["loose leaf"],
    }
  }
  human = {
    "B000000002": [
      {"instruction": "Black tea please.", "instruction_attributes": ["strong"]},
      {"instruction": "skip me", "instruction_attributes": []},
    ]
  }
  (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(products))
  (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
  (tmp_path / "items_human_ins.json").write_text(json.dumps(human))
  files = data_lib.resolve_files(tmp_path)
  assert files.products.name == "items_shuffle_1000.json" and files.human is not None
  c = data_lib.load_catalog(tmp_path)
  p1, p2 = c.products
  assert "brand" not in p1 and p1["Title"] == "Kestrel Green Tea" and p1["query"] == "green tea"
  assert (p1["pricing"], p1["Price"]) == ([10.0, 12.0], "$10.0 to $12.0")
  assert p1["options"] == {"size": ["pack of 2 | 3"]} and p1["BulletPoints"] == ["Smooth and fresh"]
  assert (p2["pricing"], p2["Price"], p2["Attributes"]) == ([100.0], "$100.0", ["DUMMY_ATTR"])
  assert 10.0 <= c.prices["B000000001"] <= 12.0 and c.prices["B000000002"] == 100.0
  # One synthetic goal (one option value); its price limit is one of 20, 30, 40, 50 above 10-12.
  (g,) = c.goals
  assert g["goal_options"] == {"size": "pack of 2 | 3"} and g["price_upper"] in (20, 30, 40, 50)
  assert g["instruction_text"] == (
    "i need green tea with size: pack of 2 | 3, and price lower than "
    f"{g['price_upper']:.2f} dollars"
  )
  text = "kestrel green tea loose leaf green tea. smooth and fresh size: pack of 2 | 3"
  assert document_text(p1) == text
  human_catalog = data_lib.load_catalog(tmp_path, goals="human")
  (hg,) = human_catalog.goals
  assert hg["instruction_text"].startswith("Black tea please, and price lower than")
  assert (hg["goal_options"], hg["weight"]) == ([], 1)
  # The env on that directory: buy the goal product.
  env = WebShopEnv(WebShopConfig(data_dir=str(tmp_path), num_test=1))
  assert env.variations(TASK, "train") == []
  env.reset(TASK, 0)
  env.step("search[green tea]")
  assert list(env.page.clickables)[-2:] == ["b000000001", "b000000002"]
  env.step("click[b000000001]")
  env.step("click[pack of 2 | 3]")
  assert env.step("click[buy now]")[3].raw_reward == 1.0
  with pytest.raises(FileNotFoundError, match="items_shuffle"):
    data_lib.resolve_files(tmp_path / "missing")


def test_fixture_files_are_the_generators_output(tmp_path):
  import filecmp
  import subprocess
  import sys

  from empo2_jax.envs.webshop.env import fixture_dir

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  script = os.path.join(root, "scripts", "make_webshop_fixture.py")
  subprocess.run([sys.executable, script, "--out", str(tmp_path)], check=True, capture_output=True)
  names = ["items_human_ins.json", "items_ins_v2.json", "items_shuffle.json"]
  assert sorted(os.listdir(tmp_path)) == names
  _, mismatch, errors = filecmp.cmpfiles(tmp_path, fixture_dir(), names, shallow=False)
  assert mismatch == errors == []
  assert sum(os.path.getsize(os.path.join(fixture_dir(), n)) for n in names) < 1_000_000


def test_loading_from_a_gs_bucket(tmp_path):
  """data_dir may be gs://: the files are read through etils.epath (here a fake bucket that maps
  gs://bkt/... to a local directory)."""
  import shutil

  from etils import epath

  from empo2_jax.envs.webshop.env import fixture_dir

  shutil.copytree(fixture_dir(), tmp_path / "bkt" / "webshop")

  def local(p):
    p = os.fspath(p)
    return str(tmp_path / p[len("gs://") :]) if p.startswith("gs://") else p

  def glob(fn, pattern):
    return ["gs://" + os.path.relpath(p, tmp_path) for p in fn(local(pattern))]

  def one(fn, path, *args, **kwargs):
    return fn(local(path), *args, **kwargs)

  with epath.testing.mock_epath(open=one, glob=glob, exists=one, isdir=one, listdir=one):
    files = data_lib.resolve_files("gs://bkt/webshop")
    assert os.fspath(files.products) == "gs://bkt/webshop/items_shuffle.json"
    remote = data_lib.load_catalog("gs://bkt/webshop")
  local_catalog = data_lib.load_catalog(fixture_dir())
  assert remote.goals == local_catalog.goals and remote.prices == local_catalog.prices
