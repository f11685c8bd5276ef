"""Every `docs/methods.md §n` the code cites names a section of that page."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CITE = re.compile(r"docs/methods\.md §(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?")


def test_methods_citations_resolve():
  headings = set(
    re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs/methods.md").read_text(), re.M)
  )
  missing = []
  for folder in ("empo2_jax", "launch", "tests", "bench", "scripts"):
    for path in sorted((ROOT / folder).rglob("*.py")):
      for m in CITE.finditer(path.read_text(encoding="utf-8")):
        missing += [
          f"{path.relative_to(ROOT)}: §{n}" for n in m.groups() if n and n not in headings
        ]
  assert not missing
