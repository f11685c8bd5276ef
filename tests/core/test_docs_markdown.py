"""The README and every page under docs/ render as written: each code fence closes, no heading cuts
a sentence in two (the line before a heading ends a sentence; the paragraph after one does not
start mid-sentence with a lower-case word), no section repeats a heading among its subsections,
every link to a section (`page.md#anchor`, `#anchor`) names a heading there, and no page ends
mid-sentence. tests/core/test_docs_index.py checks that relative links name files that exist."""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.helpers import markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# a line that ends a sentence, a list item, a table row, an image or a quote
ENDS = re.compile(r"""([.:!?)`|>*_"']|\]\([^)]*\))\s*$""")
STRUCTURE = re.compile(r"^\s*([-*+] |\d+\. |\||>|!\[|<)")


def slug(title: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"`|\*\*|__", "", title.strip().lower())
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def page_problems(text: str) -> list[str]:
  blocks, prose = markdown.parse(text)
  lines = text.splitlines()
  in_prose = {n for n, _ in prose}
  out = [f"line {b.start}: code fence never closed" for b in blocks if not b.closed]
  for b in blocks:  # a fence left open swallows the next block's opening fence (and what follows)
    inner = [i for i, line in enumerate(b.lines) if markdown.FENCE.match(line)]
    if inner and b.lang and markdown.FENCE.match(b.lines[inner[0]]).group(3).strip():
      out.append(f"line {b.start}: code fence not closed before line {b.start + 1 + inner[0]}")
  last = [line for n, line in prose if line.strip()]
  if last and not STRUCTURE.match(last[-1]) and not ENDS.search(last[-1]):
    if not markdown.HEADING.match(last[-1]) and max(n for n, _ in prose) == len(lines):
      out.append(f"the page ends mid-sentence: {last[-1].strip()!r}")
  seen: dict[int, dict[str, int]] = {}  # level -> title -> line, since the last higher heading
  for n, level, title in markdown.headings(prose):
    before = n - 1
    while before >= 1 and not lines[before - 1].strip():
      before -= 1
    prev = lines[before - 1] if before >= 1 else ""
    if (
      before in in_prose
      and not markdown.HEADING.match(prev)
      and not STRUCTURE.match(prev)
      and not ENDS.search(prev)
    ):
      out.append(f"line {n}: heading {title!r} follows an unfinished sentence: {prev.strip()!r}")
    after = n + 1
    while after <= len(lines) and not lines[after - 1].strip():
      after += 1
    nxt = lines[after - 1] if after <= len(lines) else ""
    if after in in_prose and re.match(r"^[a-z]{3,}\s", nxt) and not STRUCTURE.match(nxt):
      out.append(f"line {n}: the paragraph after heading {title!r} starts mid-sentence")
    for deeper in [k for k in seen if k > level]:
      del seen[deeper]
    siblings = seen.setdefault(level, {})
    if title in siblings:
      out.append(f"line {n}: heading {title!r} repeats line {siblings[title]}")
    siblings.setdefault(title, n)
  return out


def anchors(page: pathlib.Path) -> set[str]:
  _, prose = markdown.parse(page.read_text())
  return {slug(title) for _, _, title in markdown.headings(prose)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_renders(page):
  found = page_problems(page.read_text())
  assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)


def test_section_links_name_a_heading():
  missing = []
  for page in PAGES:
    _, prose = markdown.parse(page.read_text())
    text = "\n".join(line for _, line in prose)
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
      if re.match(r"[a-z]+://", target):
        continue
      linked = (page.parent / target) if target else page
      if linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked):
        missing.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
  assert not missing, "\n".join(missing)


def test_the_check_finds_what_breaks_a_page():
  broken = "\n".join(
    [
      "# Page",
      "",
      "Requirements: Python 3.11 and the MiniLM weights from",
      "",
      "## Install",
      "",
      "the package, which the sentence above began.",
      "",
      "## Install",
      "",
      "```bash",
      "pip install .",
      "",
      "## Swallowed heading",
    ]
  )
  found = "\n".join(page_problems(broken))
  assert "line 5: heading 'Install' follows an unfinished sentence" in found
  assert "line 5: the paragraph after heading 'Install' starts mid-sentence" in found
  assert "line 9: heading 'Install' repeats line 5" in found
  assert "line 11: code fence never closed" in found
  assert "the page ends mid-sentence" not in found  # its end is inside the open fence
  assert "Swallowed" not in found  # inside the open fence, as a renderer shows it
  fine = "# Page\n\nA sentence.\n\n## Install\n\nText.\n\n```bash\nmake\n```\n\n## Next\n\n- item\n"
  assert page_problems(fine) == []
  swallowed = "A.\n\n```bash\npip install .\n\n## Heading\n\n```bash\nmake\n```\n\nAnd then it"
  found = "\n".join(page_problems(swallowed))
  assert "line 3: code fence not closed before line 8" in found
  assert "the page ends mid-sentence: 'And then it'" in found
