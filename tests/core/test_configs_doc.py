"""docs/configs.md is what scripts/make_configs_doc.py writes from configs/*.py now."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_configs_doc_is_current():
  out = subprocess.run(
    [sys.executable, "scripts/make_configs_doc.py", "--check"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:] or out.stdout[-2000:]


def test_configs_doc_lists_every_config_file_and_variant():
  text = (ROOT / "docs" / "configs.md").read_text()
  for f in sorted((ROOT / "configs").glob("*.py")):
    assert f"`configs/{f.name}`" in text, f.name
  for spec in ("configs/sciworld.py:learn,format", "configs/webshop.py:cpu,human"):
    assert f"`{spec}`" in text
