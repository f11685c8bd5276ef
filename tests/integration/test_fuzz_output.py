"""Fuzzing what the model writes: whatever text comes out, the agent ends up with a valid action and
a clean tip, and nothing raises.

Model output reaches the simulator and the memory along three paths, all fuzzed here with a seeded
generator (thousands of cases, a few seconds):
  actor   sampled token ids -> tokenizer.decode(skip_special_tokens=True).strip() (Actor's
          `_run_episodes`) -> EnvPool.step
  env     envs.actions: normalize_action -> the parser, and when it rejects the text (or always,
          action_correction="always") correct_action against the valid actions
  memory  tips.clean_tip -> memory_text -> tips.tip_block in later prompts, and
          MemoryStore.state_dict (UTF-8) in checkpoints
The pure parts run against a recorded valid-action list (find-plant, variation 0, the first
state); the slow tests send a small share of the cases through a real ScienceWorld JVM, directly
and through the process pool.
"""

from __future__ import annotations

import random
import re
import unicodedata

import pytest

from empo2_jax import tips
from empo2_jax.envs.scienceworld import prompts
from empo2_jax.envs import actions
from empo2_jax.memory.reflect import memory_text
from empo2_jax.tips import MAX_TIP_WORDS, clean_tip
from empo2_jax.tips import strip_tips

SEED = 20240516
N_CASES = 3000

# SciWorldEnv.valid_actions() of find-plant variation 0 right after reset (the hallway).
VALID_ACTIONS = tuple(
  (
    "close art studio door|close bedroom door|close door to greenhouse|close door to kitchen|"
    "close door to living room|close door to workshop|eat orange|focus on agent|focus on air|"
    "focus on art studio|focus on art studio door|focus on bedroom|focus on bedroom door|"
    "focus on door to greenhouse|focus on door to kitchen|focus on door to living room|"
    "focus on door to workshop|focus on greenhouse|focus on hallway|focus on inventory|"
    "focus on kitchen|focus on living room|focus on orange|focus on picture|focus on workshop|"
    "go to art studio|go to art studio door|go to bedroom|go to bedroom door|"
    "go to door to greenhouse|go to door to kitchen|go to door to living room|"
    "go to door to workshop|go to greenhouse|go to kitchen|go to living room|go to workshop|"
    "inventory|look around|look at agent|look at air|look at art studio|look at art studio door|"
    "look at bedroom|look at bedroom door|look at door to greenhouse|look at door to kitchen|"
    "look at door to living room|look at door to workshop|look at greenhouse|look at hallway|"
    "look at inventory|look at kitchen|look at living room|look at orange|look at picture|"
    "look at workshop|look in art studio|look in bedroom|look in greenhouse|look in hallway|"
    "look in inventory|look in kitchen|look in living room|look in workshop|mix agent|mix air|"
    "mix art studio|mix art studio door|mix bedroom|mix bedroom door|mix door to greenhouse|"
    "mix door to kitchen|mix door to living room|mix door to workshop|mix greenhouse|mix hallway|"
    "mix inventory|mix kitchen|mix living room|mix orange|mix picture|mix workshop|"
    "move orange to art studio|move orange to bedroom|move orange to greenhouse|"
    "move orange to hallway|move orange to inventory|move orange to kitchen|"
    "move orange to living room|move orange to workshop|move picture to art studio|"
    "move picture to bedroom|move picture to greenhouse|move picture to hallway|"
    "move picture to inventory|move picture to kitchen|move picture to living room|"
    "move picture to workshop|pick up picture|put down orange|reset task|task|"
    "teleport to art studio|teleport to bathroom|teleport to bedroom|teleport to foundry|"
    "teleport to greenhouse|teleport to hallway|teleport to kitchen|teleport to living room|"
    "teleport to outside|teleport to workshop|wait|wait1"
  ).split("|")
)
VALID_WORDS = frozenset().union(*(actions.words(a) for a in VALID_ACTIONS))

# ------------------------------------------------------------------ the generator
# Code point ranges by kind; "surrogate" gives lone surrogates (a str, not valid UTF-8).
RANGES = {
  "ascii": [(0x20, 0x7E)],
  "control": [(0x00, 0x1F), (0x7F, 0x9F)],
  "cjk": [(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3)],
  "emoji": [(0x1F300, 0x1FAFF), (0x2600, 0x27BF)],
  "rtl": [(0x0590, 0x05FF), (0x0600, 0x06FF), (0x200E, 0x200F), (0x202A, 0x202E)],
  "combining": [(0x0300, 0x036F), (0x20D0, 0x20FF)],
  "space": [(0x2000, 0x200D), (0x2028, 0x2029), (0x3000, 0x3000), (0xA0, 0xA0), (0xFEFF, 0xFEFF)],
  "surrogate": [(0xD800, 0xDFFF)],
  "private": [(0xE000, 0xF8FF), (0xFFFE, 0xFFFF), (0xF0000, 0xF00FF)],
  "any": [(0x0, 0x10FFFF)],
}
FRAGMENTS = (
  "<tip>",
  "</tip>",
  "<tip",
  "</ti",
  "p>",
  "<ti\u200bp>",
  "</TIP>",
  "<|im_end|>",
  "<|im_start|>",
  "<|im_start|>assistant\n",
  "<|im_start|> user",
  "<|endoftext|>",
  "<|",
  "|>",
  "Tip:",
  "**Summary**:",
  "Reflection -",
  '"',
  "Ambiguous request: Please enter the number for the action you intended (or blank to cancel):",
  "0:",
  "0",
  "1",
  "No known action matches that input.",
  "\n",
  "\r\n",
  "\x00",
  "\t",
  "\u2028",
  "\x85",
  "  ",
  "look around",
  "open door to kitchen",
  "focus on",
  "go to",
  "move orange to",
  "reset task",
)


def random_text(rng: random.Random, kind: str, n: int) -> str:
  ranges = RANGES[kind]
  out = []
  for _ in range(n):
    lo, hi = rng.choice(ranges)
    out.append(chr(rng.randint(lo, hi)))
  return "".join(out)


def random_bytes_text(rng: random.Random, n: int) -> str:
  data = bytes(rng.getrandbits(8) for _ in range(n))
  errors = rng.choice(("replace", "ignore", "surrogateescape", "backslashreplace"))
  codec = rng.choice(("utf-8", "utf-8", "latin-1", "utf-16-le"))
  if codec == "utf-16-le":  # any even number of bytes decodes, unpaired surrogates included
    data, errors = data[: len(data) // 2 * 2], "surrogatepass"
  return data.decode(codec, errors=errors)


def mixed_text(rng: random.Random, parts: int) -> str:
  pieces = []
  for _ in range(parts):
    r = rng.random()
    if r < 0.35:
      pieces.append(rng.choice(FRAGMENTS))
    elif r < 0.55:
      pieces.append(rng.choice(VALID_ACTIONS))
    elif r < 0.65:
      pieces.append(random_bytes_text(rng, rng.randint(0, 12)))
    else:
      pieces.append(random_text(rng, rng.choice(list(RANGES)), rng.randint(0, 8)))
  sep = rng.choice(("", " ", "\n", "\t"))
  return sep.join(pieces)


def fuzz_cases(seed: int = SEED, n: int = N_CASES) -> list[str]:
  """The fixed edge cases, then `n` seeded random ones."""
  rng = random.Random(seed)
  cases = [
    "",
    " ",
    "\n",
    " \t\r\n\x0b\x0c\u3000\u00a0\u2028\u2029\x85 ",
    "\x00",
    "\x00" * 100,
    "\ud800",
    "look\ud800 around",
    "\ufeff\u200b\u200d",
    "x" * 10_000,
    "look around " * 1000,
    ("a" * 10_000 + "\n") * 5,
    "\n".join(rng.choice(VALID_ACTIONS) for _ in range(2000)),
    "<|im_end|>",
    "<|im_start|>assistant\nopen door to kitchen<|im_end|>",
    "<tip></tip>",
    "</tip> go to kitchen <tip>",
    "\u202eneehctik ot og",
    "\u05e4\u05ea\u05d7 \u05d3\u05dc\u05ea",
    "\u6253\u5f00\u53a8\u623f\u7684\u95e8",
    "\U0001f600" * 50,
    "e\u0301" * 200,
    "o\u0300\u0301\u0302\u0303\u0304 pen door",
  ]
  for _ in range(n):
    r = rng.random()
    if r < 0.2:
      cases.append(random_bytes_text(rng, rng.choice((1, 8, 64, 512))))
    elif r < 0.5:
      cases.append(random_text(rng, rng.choice(list(RANGES)), rng.choice((1, 4, 32, 256))))
    elif r < 0.98:
      cases.append(mixed_text(rng, rng.randint(1, 12)))
    elif r < 0.99:  # a long single line
      cases.append(mixed_text(rng, 40) * rng.randint(10, 40))
    else:  # very long multi-line output
      cases.append("\n".join(mixed_text(rng, 5) for _ in range(rng.randint(100, 300))))
  return cases


CASES = fuzz_cases()


def test_generator_covers_the_edge_cases():
  assert len(CASES) > N_CASES
  assert fuzz_cases() == CASES  # seeded
  joined = "".join(CASES[:400])
  for needle in ("<tip>", "</tip>", "<|im_end|>", "\x00", "\ud800", "\u202e", "\n"):
    assert needle in joined
  assert any(len(c) >= 10_000 for c in CASES)
  assert any(len(c.splitlines()) >= 100 for c in CASES)
  assert any(unicodedata.category(ch) == "Mn" for ch in joined)  # combining marks


# ------------------------------------------------------------------ invariants
def check_clean_text(text: str) -> None:
  """What may reach the simulator, a prompt or a checkpoint: encodable, no control or invisible
  characters, one line."""
  text.encode("utf-8")  # raises on lone surrogates
  bad = [ch for ch in text if unicodedata.category(ch)[0] == "C"]
  assert not bad, f"non-printable characters left: {bad[:5]!r}"
  assert len(text.splitlines()) <= 1


def check_action(raw: str, no_fallback: bool = False) -> str:
  """The env's mapping of one model text (both correction modes); returns what would be sent."""
  text = actions.normalize_action(raw)
  assert actions.normalize_action(text) == text  # idempotent
  assert text == text.strip() and "  " not in text
  check_clean_text(text)
  executed = actions.correct_action(text, VALID_ACTIONS)
  assert executed in VALID_ACTIONS, (raw[:80], executed)
  if no_fallback:  # no word in common: every candidate ties and character similarity decides
    assert actions.correct_action(text, VALID_ACTIONS, fallback=None) in VALID_ACTIONS
  if not actions.words(text) & VALID_WORDS:  # nothing in common: the harmless fallback
    assert executed == actions.DEFAULT_FALLBACK_ACTION
  if text in VALID_ACTIONS:
    assert executed == text
  return text


def check_tip(raw: str, max_words: int = MAX_TIP_WORDS) -> str:
  tip = clean_tip(raw, max_words)
  assert isinstance(tip, str) and tip == tip.strip()
  check_clean_text(tip)
  assert "<tip>" not in tip and "</tip>" not in tip
  assert not re.search(r"<\|[^|>]*\|>", tip)
  assert len(tip.split()) <= max_words
  # In a later prompt the tip sits inside a tip block, which strip_tips must remove whole.
  memory = memory_text(tip, "look around", 25) if tip else tip
  head, tail = "Observation: You see a door.\n\n", prompts.INSTRUCTION
  assert strip_tips(head + tips.tip_block([memory, memory]) + tail) == head + tail
  return tip


# ------------------------------------------------------------------ pure paths
def test_fuzz_action_mapping():
  sent = [check_action(c, no_fallback=i % 10 == 0 and len(c) < 1000) for i, c in enumerate(CASES)]
  assert sent.count("") > 10  # empty and unusable texts were exercised (mapped to the fallback)


def test_fuzz_tip_cleaner():
  tips = [check_tip(c) for c in CASES]
  assert sum(1 for t in tips if t) > len(tips) // 2
  rng = random.Random(SEED + 1)
  for c in rng.sample(CASES, 300):
    check_tip(c, max_words=rng.randint(1, 5))


def test_known_bad_inputs():
  assert actions.normalize_action("look\x00around") == "look around"
  assert actions.normalize_action("open\u200b door\ud800 to kitchen\x07") == "open door to kitchen"
  assert actions.normalize_action(" \u3000\u2028 ") == ""
  assert actions.normalize_action("水 😀 e\u0301") == "水 😀 e\u0301"  # printable: kept
  assert clean_tip("<ti\u200bp> heat it\ud800 first </tip>\nsecond line") == "heat it first"
  assert clean_tip("\x00\x00\n\x07\n\u200b") == ""
  assert clean_tip("\x1b[31mred\x1b[0m text") == "[31mred [0m text"


@pytest.fixture(scope="module")
def tokenizer():
  from empo2_jax.model.tokenizer import load_tokenizer

  return load_tokenizer(None)  # the Qwen2.5 tokenizer of the CPU configs


def test_fuzz_decoded_token_ids(tokenizer):
  """Random token ids (special tokens included) decoded as the actor decodes a response."""
  rng = random.Random(SEED + 2)
  vocab = len(tokenizer)
  specials = list(range(vocab - 22, vocab))
  for _ in range(1500):
    n = rng.choice((0, 1, 2, 8, 32, 128))
    ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(vocab) for _ in range(n)]
    text = tokenizer.decode(ids, skip_special_tokens=True).strip()  # Actor.rollout
    check_action(text)
    check_tip(tokenizer.decode(ids, skip_special_tokens=True))  # Actor.reflect
  # Fuzz text through the tokenizer and back (what a model that copies its input would write).
  for c in CASES[:: max(1, len(CASES) // 500)]:
    ids = tokenizer(c.encode("utf-8", "replace").decode("utf-8"), add_special_tokens=False)
    text = tokenizer.decode(ids["input_ids"][:512], skip_special_tokens=True).strip()
    check_action(text)
    check_tip(text)


# ------------------------------------------------------------------ a real simulator
ENV_CASES = CASES[:23] + random.Random(SEED + 3).sample(CASES[23:], 25)


@pytest.mark.slow
def test_fuzz_through_scienceworld():
  """A share of the cases through one JVM, both correction modes: no exception, and what ran is
  what the parser accepted (the text itself) or a valid action of that state."""
  from empo2_jax.envs.scienceworld.env import SciWorldConfig, SciWorldEnv, ScienceWorldJvm

  jvm = ScienceWorldJvm()
  try:
    for mode in actions.CORRECTION_MODES:
      cfg = SciWorldConfig(action_correction=mode, default_max_steps=1000, env_step_limit=10_000)
      env = SciWorldEnv(cfg, jvm=jvm)
      env.reset("find-plant", 0)
      for raw in ENV_CASES:
        valid_before = env.valid_actions()
        result = env.step(raw)
        info = result.info
        assert result.observation != actions.PARSER_REJECTION, (mode, raw[:80])
        check_clean_text(info.executed_action)
        if mode == "always" or not info.valid:
          assert info.executed_action in valid_before, (mode, raw[:80], info.executed_action)
        if result.done:
          env.reset("find-plant", 0)
  finally:
    jvm.close()


@pytest.mark.slow
def test_fuzz_through_env_pool():
  """The inputs that used to kill a worker (a lone surrogate made the JVM bridge fail: four
  worker replacements, then env_failed) go through the pool without a restart."""
  from empo2_jax.envs.pool import EnvPool, PoolConfig
  from empo2_jax.envs.scienceworld.env import SciWorldConfig

  nasty = ["\ud800", "look\udcff around", "\x00", "", "x" * 10_000, "<|im_end|>", "\U0001f600"]
  cfg = SciWorldConfig(default_max_steps=1000, env_step_limit=10_000)
  with EnvPool(cfg, PoolConfig(num_workers=1, max_retries=1)) as pool:
    pool.reset([("find-plant", 0), ("find-plant", 1)])
    for raw in nasty + ENV_CASES[23:33]:
      results = pool.step([raw, raw])
      for r in results:
        assert not r.info.env_failed
        check_clean_text(r.info.executed_action)
        assert r.info.executed_action
      if any(r.done for r in results):
        pool.reset([("find-plant", 0), ("find-plant", 1)])
    assert pool.restarts == 0
