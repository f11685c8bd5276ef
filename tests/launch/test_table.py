"""launch/table.py on synthetic run directories: Table 1 layout (topics, method columns in registry
order, mean ± std, best in bold, average row), CSV/LaTeX, seeds, Table 2 for WebShop."""

import csv
import io
import subprocess
import sys

import numpy as np
import pytest

from empo2_jax.baselines.results import read_results, write_result
from launch import table


def _run(root, name, method, task, returns, env="scienceworld", successes=None):
  successes = successes if successes is not None else [r > 70 for r in returns]
  write_result(root / name, method=method, task=task, env=env, returns=returns, successes=successes)


@pytest.fixture()
def runs(tmp_path):
  _run(tmp_path, "naive_fa", "naive", "find-animal", [-100.0, 0.0])
  _run(tmp_path, "grpo_fa", "grpo", "find-animal", [50.0, 100.0])
  _run(tmp_path, "empo2_fa", "empo2", "find-animal", [100.0, 100.0])
  _run(tmp_path, "naive_cm", "naive", "chemistry-mix", [10.0, 20.0])
  _run(tmp_path, "grpo_cm", "grpo", "chemistry-mix", [30.0, 10.0])
  _run(tmp_path, "empo2_cm_s0", "empo2", "chemistry-mix", [40.0, 40.0])  # two seeds
  _run(tmp_path, "empo2_cm_s1", "empo2", "chemistry-mix", [0.0, 0.0])
  return tmp_path


def test_table1_markdown_layout(runs):
  md = table.write_tables(read_results([str(runs)]), runs / "out")
  lines = md.strip().splitlines()
  assert lines[0] == "| Topic | Task | Naive | GRPO | EMPO2 |"
  # Chemistry comes before Classification (the paper's task order); topic named once per group
  assert lines[2].startswith("| Chemistry | chemistry-mix |")
  assert lines[3].startswith("| Classification | find-animal |")
  # chemistry-mix: naive 15 ± 5, grpo 20 ± 10 (best), empo2 = two seeds: mean 20 ± std 20 (tie)
  assert (
    lines[2] == "| Chemistry | chemistry-mix | 15.0 ± 5.0 | **20.0 ± 10.0** | **20.0 ± 20.0** |"
  )
  assert (
    lines[3] == "| Classification | find-animal | -50.0 ± 50.0 | 75.0 ± 25.0 | **100.0 ± 0.0** |"
  )
  # average of the per-task means: naive (15 - 50) / 2, grpo (20 + 75) / 2, empo2 (20 + 100) / 2
  assert lines[4] == "| | **Average** | -17.5 | 47.5 | **60.0** |"
  assert (runs / "out" / "table1.md").read_text() == md
  assert not (runs / "out" / "table2.md").exists()


def test_table1_csv_and_latex(runs):
  table.write_tables(read_results([str(runs)]), runs / "out")
  rows = list(csv.DictReader(io.StringIO((runs / "out" / "table1.csv").read_text())))
  assert len(rows) == 6
  e = next(r for r in rows if r["method"] == "empo2" and r["task"] == "chemistry-mix")
  assert e["runs"] == "2" and float(e["return_mean"]) == 20.0 and e["episodes"] == "4"
  tex = (runs / "out" / "table1.tex").read_text()
  assert "\\textbf{100.0 $\\pm$ 0.0}" in tex and tex.count("\\\\") == 4
  assert tex.startswith("\\begin{tabular}{llccc}")


def test_missing_cell_and_webshop_table2(tmp_path):
  _run(tmp_path, "a", "reflexion", "find-plant", [10.0])
  _run(tmp_path, "b", "grpo", "find-plant", [20.0])
  _run(tmp_path, "c", "grpo", "find-animal", [30.0])
  _run(tmp_path, "w1", "grpo", "webshop", [79.3, 60.0], env="webshop", successes=[True, False])
  _run(tmp_path, "w2", "gigpo", "webshop", [90.0, 80.0], env="webshop", successes=[True, True])
  md = table.write_tables(read_results([str(tmp_path)]), tmp_path / "out")
  assert "| Classification | find-animal | – | **30.0 ± 0.0** |" in md
  assert "| | **Average** | – | **25.0** |" in md  # reflexion lacks a task: no average
  t2 = (tmp_path / "out" / "table2.md").read_text().splitlines()
  assert t2[0] == "| Method | Score | Success (%) |"
  assert t2[2] == "| GiGPO w/o std | **85.0** | **100.0** |"
  assert t2[3] == "| GRPO | 69.7 | 50.0 |"
  assert "webshop" not in (tmp_path / "out" / "table1.md").read_text()


def test_cli_and_missing_results(tmp_path, runs):
  out = subprocess.run(
    [sys.executable, "launch/table.py", f"--runs={runs}", f"--out={tmp_path / 'o'}"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert "**Average**" in out.stdout and (tmp_path / "o" / "table1.tex").exists()
  (tmp_path / "empty").mkdir()
  bad = subprocess.run(
    [sys.executable, "launch/table.py", f"--runs={tmp_path / 'empty'}", "--out=/tmp/x"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert bad.returncode != 0 and "launch/eval.py" in bad.stderr


def test_result_record_checks():
  from empo2_jax.baselines.results import result_record

  r = result_record("naive", "t", "scienceworld", [1.0, 3.0], [False, True], {"k": 1})
  assert r["return_mean"] == 2.0 and r["return_std"] == 1.0 and r["success"] == 0.5 and r["k"] == 1
  with pytest.raises(ValueError):
    result_record("naive", "t", "scienceworld", [], [])
  assert np.isclose(table.cells([r])[("t", "naive")]["std"], 1.0)
