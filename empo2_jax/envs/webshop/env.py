"""WebShop as a `TextEnv`: the original text env's page flow over an original-format catalogue.

  env = WebShopEnv(WebShopConfig(data_dir=...))     # data_dir "" = the bundled fixture
  obs, info = env.reset("webshop", goal_index)      # goal indices: env.variations("webshop", split)
  obs, reward, done, info = env.step("search[red running shoes]")

Actions (the original's `step`): `search[keywords]` runs a search from any page when the keywords
are non-empty; `click[x]` acts when x is a clickable of the current page (other than 'search');
anything else changes nothing (reward 0, same page; `info.valid` False). The argument is matched
lower-cased, as the original does; like verl-agent's projection we lower-case the whole action and,
when the text holds `<action>...</action>`, use what is inside the first pair. Click routing: Buy
Now ends the episode with the reward; Back to Search returns to the start page and forgets the
search, product and options; Next > / < Prev page through results; < Prev on a sub-page returns to
the item page, on an item page to the results page; Description/Features/Reviews open sub-pages;
an asin opens its item page (options already chosen are kept, as in the original); an option value
selects it. A new search forgets the product and options.

Rewards (`reward_mode`): the purchase is scored by `reward.get_reward` (0..1, "raw"); every other
step's reward is 0. "score" (default) returns 100 x raw at Buy Now, so an episode's return is its
Table 2 score (score = final raw reward x 100); the trainer takes an episode's return from
`info.score` (the return so far, as for every env here), and with this mode that return, the
evaluation's mean return and GiGPO's step returns are all on the Table 2 scale. "verl" returns 10
for a perfect purchase (raw == 1) and 0 otherwise, verl-agent's scaling (GiGPO's WebShop runs);
"raw" returns raw. In every mode `info.raw_reward` is the raw reward and `info.success` is
raw == 1.0 (Table 2's success). An episode also ends, truncated, after `max_steps` agent steps (15,
verl-agent's setting). Invalid actions are no-ops (`info.valid` False), which GiGPO's invalid-action
penalty (advantage.invalid_penalty) reads.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import re
from importlib import resources

from empo2_jax.envs.base import ResetInfo, ResetResult, StepInfo, StepResult, check_split
from empo2_jax.envs.webshop import data as data_lib
from empo2_jax.envs.webshop import pages
from empo2_jax.envs.webshop import prompts as agent_prompts
from empo2_jax.envs.webshop.reward import Reward, get_reward
from empo2_jax.envs.webshop.search import BACKENDS, PRODUCT_WINDOW, SEARCH_RETURN_N, SearchEngine

TASK = "webshop"
TASKS = (TASK,)
REWARD_MODES = ("score", "verl", "raw")
OBSERVATIONS = ("text", "agent")
VERL_SUCCESS_REWARD = 10.0
_ACTION_RE = re.compile(r"(.+)\[(.+)\]")
_TAGGED_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL)


def fixture_dir() -> str:
  """The bundled fixture catalogue (original file formats; scripts/make_webshop_fixture.py)."""
  return str(resources.files("empo2_jax.envs.webshop") / "fixture")


@dataclasses.dataclass(frozen=True)
class WebShopConfig:
  data_dir: str = ""  # original-format directory, local or gs://; "" = the bundled fixture
  goals: str = "synthetic"  # or "human" (items_human_ins.json)
  price_seed: int = 0  # seeds the sampled prices and price limits (data.py)
  num_products: int | None = None  # only the first N product records, like the original's option
  num_test: int = 500  # test = goals [0, num_test) after the seed-233 shuffle
  num_dev: int = 0  # dev = the next num_dev goals; train = the rest
  num_train_variations: int = 0  # used_variations(): the first N goals; 0 = all
  num_dev_variations: int = 0
  num_test_variations: int = 0
  max_steps: int = 15
  reward_mode: str = "score"
  show_attrs: bool = False  # the original's hidden Attributes sub-page
  search_backend: str = "lucene"  # or "bm25s" (search.py)
  observation: str = "text"  # the original's page text, or "agent": verl-agent's view (prompts.py)

  def __post_init__(self):
    if self.reward_mode not in REWARD_MODES:
      raise ValueError(f"reward_mode={self.reward_mode!r}; valid: {', '.join(REWARD_MODES)}")
    if self.goals not in data_lib.GOAL_MODES:
      raise ValueError(f"goals={self.goals!r}; valid: {', '.join(data_lib.GOAL_MODES)}")
    if self.search_backend not in BACKENDS:
      raise ValueError(f"search_backend={self.search_backend!r}; valid: {', '.join(BACKENDS)}")
    if self.observation not in OBSERVATIONS:
      raise ValueError(f"observation={self.observation!r}; valid: {', '.join(OBSERVATIONS)}")
    if self.max_steps < 1:
      raise ValueError(f"max_steps={self.max_steps} must be >= 1")
    for name in (
      "num_test",
      "num_dev",
      "num_train_variations",
      "num_dev_variations",
      "num_test_variations",
    ):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")

  def num_variations(self, split: str) -> int:
    check_split(split)
    return {
      "train": self.num_train_variations,
      "dev": self.num_dev_variations,
      "test": self.num_test_variations,
    }[split]

  @property
  def resolved_data_dir(self) -> str:
    return self.data_dir or fixture_dir()


@dataclasses.dataclass(frozen=True)
class WebShopResetInfo(ResetInfo):
  goal: dict = dataclasses.field(default_factory=dict)
  has_search_bar: bool = True
  clickables: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class WebShopStepInfo(StepInfo):
  raw_reward: float = 0.0  # get_reward of the purchase, 0 before Buy Now
  page: str = ""  # kind of the page now shown
  has_search_bar: bool = False
  clickables: tuple[str, ...] = ()
  purchased: str = ""  # asin bought ('' when not done by Buy Now)


@functools.lru_cache(maxsize=4)
def load(data_dir: str, goals: str, price_seed: int, num_products, backend: str = "lucene"):
  """(Catalog, SearchEngine) for a data directory, built once per process and shared."""
  catalog = data_lib.load_catalog(
    data_dir, goals=goals, price_seed=price_seed, num_products=num_products
  )
  return catalog, SearchEngine(catalog.products, backend=backend)


def extract_action(text: str) -> str:
  """The action in a model's text: inside the first <action>...</action> if present, else the
  first line that looks like name[arg], else the whole text; lower-cased and stripped."""
  text = str(text)
  m = _TAGGED_RE.search(text)
  if m:
    return m.group(1).strip().lower()
  for line in text.splitlines():
    if _ACTION_RE.match(line.strip()):
      return line.strip().lower()
  return text.strip().lower()


def parse_action(action: str) -> tuple[str, str | None]:
  """(name, argument) as the original parses `name[argument]`; (action, None) otherwise."""
  m = _ACTION_RE.match(action)
  return (m.group(1), m.group(2)) if m else (action, None)


class WebShopEnv:
  """One WebShop session at a time; cheap to create once the catalogue is loaded (shared)."""

  def __init__(self, config: WebShopConfig | None = None):
    self.config = config or WebShopConfig()
    c = self.config
    self.catalog, self.engine = load(
      c.resolved_data_dir, c.goals, c.price_seed, c.num_products, c.search_backend
    )
    self._goal_index = None
    self._done = False

  # ----------------------------------------------------------------- tasks and splits
  @property
  def tasks(self) -> tuple[str, ...]:
    return TASKS

  def variations(self, task: str, split: str) -> list[int]:
    """Goal indices of `split` (module doc of data.py)."""
    self._check_task(task)
    check_split(split)
    return self.catalog.split_indices(split, self.config.num_test, self.config.num_dev)

  def used_variations(self, task: str, split: str) -> list[int]:
    """The goals used for `split`: its first `num_<split>_variations` (all of them for 0)."""
    goals = self.variations(task, split)
    n = self.config.num_variations(split)
    return goals[:n] if n else goals

  @property
  def goal(self) -> dict:
    return self.catalog.goals[self._goal_index]

  # ----------------------------------------------------------------- episode
  def reset(self, task: str, variation: int) -> ResetResult:
    self._check_task(task)
    n = len(self.catalog.goals)
    if not isinstance(variation, numbers.Integral) or not 0 <= variation < n:
      raise ValueError(f"Goal index {variation!r} is out of range (0..{n - 1}).")
    variation = self._goal_index = int(variation)
    self._done = False
    self._steps = 0
    self._start_page()
    g = self.goal
    info = WebShopResetInfo(
      task=task,
      variation=variation,
      task_description=g["instruction_text"],
      inventory="",
      max_steps=self.config.max_steps,
      goal=dict(g),
      has_search_bar=True,
      clickables=tuple(self.page.clickables),
    )
    return ResetResult(self.observation, info)

  def step(self, action_text: str) -> StepResult:
    if self._goal_index is None:
      raise RuntimeError("WebShopEnv.step called before reset(task, goal_index).")
    if self._done:
      raise RuntimeError("The episode is over; call reset before stepping again.")
    action = extract_action(action_text)
    name, arg = parse_action(action)
    result: Reward | None = None
    valid = True
    if name == "search" and arg:
      self._search(arg)
    elif name == "click" and arg in self.page.clickables and arg != "search":
      result = self._click(arg)
    else:
      valid = False
    self._steps += 1
    raw = result.total if result is not None else 0.0
    bought = result is not None
    truncated = not bought and self._steps >= self.config.max_steps
    self._done = bought or truncated
    reward = self._scaled(raw, bought)
    info = WebShopStepInfo(
      score=reward,  # the return so far: the only non-zero reward is the purchase's
      valid=valid,
      raw_action=str(action_text),
      executed_action=action,
      moves=self._steps,
      steps=self._steps,
      truncated=truncated,
      success=bought and raw == 1.0,
      raw_reward=raw,
      page=self.page.kind,
      has_search_bar=self.page.has_search_bar,
      clickables=tuple(self.page.clickables),
      purchased=self._asin if bought else "",
    )
    return StepResult(self.observation, reward, self._done, info)

  @property
  def observation(self) -> str:
    """The current page as the original's text mode shows it, or the agent's view of it."""
    if self.config.observation == "text":
      return self.page.observation
    return agent_prompts.agent_observation(
      self.page.observation,
      self.goal["instruction_text"],
      self.page.has_search_bar,
      list(self.page.clickables),
    )

  def available_actions(self) -> dict:
    """The original's `get_available_actions` of the current page."""
    return dict(has_search_bar=self.page.has_search_bar, clickables=list(self.page.clickables))

  def close(self) -> None:
    pass

  def __enter__(self) -> "WebShopEnv":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ----------------------------------------------------------------- page flow
  def _scaled(self, raw: float, bought: bool) -> float:
    if not bought:
      return 0.0
    mode = self.config.reward_mode
    if mode == "verl":
      return VERL_SUCCESS_REWARD if raw == 1.0 else 0.0
    return 100.0 * raw if mode == "score" else raw

  def _start_page(self) -> None:
    self._keywords, self._results, self._page_no = None, [], None
    self._asin, self._options = None, {}
    self.page = pages.search_page(self.goal["instruction_text"])

  def _search(self, keywords: str, page_no: int = 1) -> None:
    if keywords != self._keywords:
      hits = self.engine.search(keywords, k=SEARCH_RETURN_N)
      self._results = [a for a in hits if a in self.catalog.by_asin]
    self._keywords, self._page_no = keywords, page_no
    self._asin, self._options = None, {}
    self._show_results()

  def _show_results(self) -> None:
    lo = (self._page_no - 1) * PRODUCT_WINDOW
    shown = [self.catalog.by_asin[a] for a in self._results[lo : lo + PRODUCT_WINDOW]]
    instr = self.goal["instruction_text"]
    self.page = pages.results_page(instr, shown, self._page_no, len(self._results))

  def _show_item(self) -> None:
    product = self.catalog.by_asin[self._asin]
    self.page = pages.item_page(self.goal["instruction_text"], product, self.config.show_attrs)

  def _click(self, arg: str) -> Reward | None:
    kind, what = self.page.clickables[arg]
    current = self.page.kind
    if arg == "buy now":
      product = self.catalog.by_asin[self._asin]
      result = get_reward(product, self.goal, self.catalog.prices[self._asin], self._options)
      self.page = pages.done_page(self._asin, self._options, result.total)
      return result
    if arg == "back to search":
      self._start_page()
    elif arg in ("next >", "< prev") and current == "results":
      self._search(self._keywords, self._page_no + (1 if arg == "next >" else -1))
    elif arg == "< prev" and current in pages.SUB_PAGES:
      self._show_item()
    elif arg == "< prev" and current == "item":
      self._page_no = self._page_no or 1
      # The original re-runs the search and forgets the chosen options.
      self._search(self._keywords or "", self._page_no)
    elif arg in pages.SUB_PAGES:
      self.page = pages.sub_page(
        self.goal["instruction_text"], self.catalog.by_asin[self._asin], arg
      )
    elif kind == "asin":
      self._asin = what
      self._show_item()
    elif kind == "option":
      self._options[what] = arg
      self._show_item()
    return None

  def _check_task(self, task: str) -> None:
    if task not in TASKS:
      raise ValueError(f"Unknown task {task!r}. Valid tasks: {', '.join(TASKS)}.")
