"""What users read says what is true now, not how the project was made: no tracker numbers, work
sessions, queues or calendar talk in the README, the docs, the configs, the package's comments
and docstrings (its C++ sources too), the launch scripts, the scripts, the benches or the tests
(commit messages are where that goes). docs/records/ keeps the dated history of measurements and
runs, so the machine and workspace talk below is allowed there; tracker numbers are not.

"session" stays where it names a real thing: the sampler's multi-turn `Session` (its KV-cache
rows, its calls) and WebShop's shopping sessions. A hit is allowed when the text around it
names one of those."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

FILES = (
  ["README.md", "Makefile"]
  + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md"))]
  + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "configs").glob("*.py"))]
  + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "empo2_jax").rglob("*.py"))]
  + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "launch").glob("*.py"))]
  + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").glob("*")) if p.is_file()]
  + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "bench").glob("*.py"))]
  + [
    str(p.relative_to(ROOT))
    for ext in ("*.cc", "*.h")
    for p in sorted((ROOT / "empo2_jax").rglob(ext))
  ]
  + [
    str(p.relative_to(ROOT))
    for p in sorted((ROOT / "tests").rglob("*.py"))
    if p.name != pathlib.Path(__file__).name  # this file quotes what it bans
  ]
)
RECORDS = "docs/records/"

# Always process text, wherever it appears.
BANNED = [
  r"\bissues? ?#?\d+",  # a tracker number ("issue 15", "issues 28", "issue #3")
  r"\bwork ?queue",
  r"\bthe queue\b",
  r"\bqueued? (for|at|above|below|line)",
  r"\bthis week\b",
  r"\b(at|of) this writing\b",
  r"\bthe experiment paused\b",
  r"\bcommitted before (it|they|E) (started|ran|runs|continues)",
  r"\bwritten before this\b",
  r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) sessions?\b",
  r"\b(this|that|a|one|each|every|the last|earlier|later|previous|next|two|three|several|"
  r"different|new) sessions?(?:'s?)?\b(?! call)",
  r"\bsessions?'",  # "this session's", "sessions' soaks"
  r"\bsessions? (of|ended|allows|shared|started|restarts?|archives)\b",
  r"\b(across|over|spans?|between|in different|within a) sessions?\b",
]

# Process text that docs/records/ may keep (dated history of where and how a figure was taken).
NOT_IN_REPORTS = [
  r"\bthis 2-core\b",  # the machine the project was made on, as if the reader had it
  r"\bmachine's workspace\b",
  r"\bthe issue (measured|asked|says|found|reported)\b",
]

# "session" names a real thing when the text near it says which.
SESSION_OK = re.compile(
  r"Session|sampler|sampling|session\.py|KV|cache|rollout|prefix|row|call|webshop|WebShop|"
  r"actor|open|multi-turn|reflect|SESSION_COUNTERS",
)


def _hits(text: str, records: bool = False):
  for pattern in BANNED + ([] if records else NOT_IN_REPORTS):
    for m in re.finditer(pattern, text, flags=re.IGNORECASE):
      near = text[max(0, m.start() - 60) : m.end() + 60]
      if "session" in m.group(0).lower() and SESSION_OK.search(near.replace(m.group(0), " ")):
        continue
      yield m


def test_scanned_files_exist():
  assert "README.md" in FILES and any(f.startswith("docs/") for f in FILES)
  assert any(f.startswith("empo2_jax/") for f in FILES) and "configs/sweeps.py" in FILES
  for where in ("tests/", "bench/", "scripts/", "empo2_jax/model/cpu_kernels.cc"):
    assert any(f.startswith(where) for f in FILES), where
  assert "empo2_jax/model/cpu_kernels.h" in FILES and __file__.split("/")[-1] not in str(FILES)


def test_no_process_text_in_what_users_read():
  found = []
  for rel in FILES:
    path = ROOT / rel
    if not path.exists() or path.suffix in (".png", ".json", ".jsonl"):
      continue
    text = path.read_text(errors="replace")
    for m in _hits(text, records=rel.startswith(RECORDS)):
      line = text.count("\n", 0, m.start()) + 1
      found.append(f"{rel}:{line}: {m.group(0)!r}")
  assert not found, "process text (say what is true now; history goes in commits):\n" + "\n".join(
    found
  )


def test_the_patterns_catch_process_text_and_spare_the_sampler():
  bad = [
    "after the activation sharding of issue 15",
    "its runs here (2026-11-30, sixth session)",
    "were made one at a time over two sessions",
    "Before this session's two cuts",
    "This session's queue runs first",
    "the experiment paused",
    "(committed before it started)",
    "`learn` fits this 2-core CPU machine",
    "was lost with the machine's workspace",
    "(the 72/80 the issue measured)",
  ]
  good = [
    "make ONE `Session.step` call for all of them",
    "the rollout's sampler session stays open",
    "One session call; row r draws with fold_in",
    "WebShop: 100 fixed sessions",
    "multi-turn sessions with prefix reuse (`session.py`)",
    "tensorboardX's SummaryWriter queues events for a thread",
  ]
  assert all(list(_hits(t)) for t in bad), [t for t in bad if not list(_hits(t))]
  assert not any(list(_hits(t)) for t in good), [t for t in good if list(_hits(t))]


def test_records_keep_dated_history_but_no_tracker_numbers():
  assert not list(_hits("lost with the machine's workspace (2026-12-05)", records=True))
  assert list(_hits("as issue 16 asked", records=True))
