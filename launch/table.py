"""The paper's tables from evaluated runs (each run directory holds eval/result.json,
empo2_jax/baselines/results.py).

  python launch/table.py --runs=runs/table1 --out=docs/table1       # a sweep root: all its runs
  python launch/table.py --runs=runs/naive_fa,runs/grpo_fa,... --out=/tmp/t

Table 1 (ScienceWorld and any other env but WebShop): one row per task, grouped by topic, one
column per method (in the order of empo2_jax/methods/, labels from there), cells
"mean ± std" of the return, the best mean of each row in bold, and an "Average" row (the mean of
the per-task means, as the paper reports). A cell with one run shows the std over its episodes;
a cell with several runs (seeds) shows the mean and std over the runs' means.
Table 2 (WebShop runs, when there are any): one row per method, score and success rate (%).
Writes table1.md, table1.csv, table1.tex (and table2.* for WebShop) into --out; prints the
markdown.
"""

from __future__ import annotations

import argparse
import csv
import io
from typing import Sequence

import numpy as np
from etils import epath

from empo2_jax.baselines.results import read_results
from empo2_jax import methods as methods_lib
from empo2_jax import cli  # noqa: E402

# ScienceWorld's topics (the simulator's task groups), in the order of the paper's task list.
TOPICS: dict[str, tuple[str, ...]] = {
  "Chemistry": (
    "chemistry-mix",
    "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color",
  ),
  "Classification": ("find-animal", "find-living-thing", "find-non-living-thing", "find-plant"),
  "Biology": (
    "identify-life-stages-1",
    "identify-life-stages-2",
    "lifespan-longest-lived",
    "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived",
    "grow-fruit",
    "grow-plant",
    "mendelian-genetics-known-plant",
    "mendelian-genetics-unknown-plant",
  ),
  "Electricity": (
    "power-component",
    "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity",
    "test-conductivity-of-unknown-substances",
  ),
  "Measurement": (
    "measure-melting-point-known-substance",
    "measure-melting-point-unknown-substance",
    "use-thermometer",
  ),
  "Matter": ("boil", "change-the-state-of-matter-of", "freeze", "melt"),
  "Forces": (
    "inclined-plane-determine-angle",
    "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces",
  ),
}
WEBSHOP = "webshop"


def topic_of(task: str, env: str = "scienceworld") -> str:
  for topic, tasks in TOPICS.items():
    if task in tasks:
      return topic
  return env.capitalize() if env else "Other"


def _task_order(task: str) -> tuple:
  flat = [t for ts in TOPICS.values() for t in ts]
  return (flat.index(task), task) if task in flat else (len(flat), task)


def _method_order(names: Sequence[str]) -> list[str]:
  reg = methods_lib.names()
  return sorted(set(names), key=lambda m: (reg.index(m) if m in reg else len(reg), m))


def _label(method: str) -> str:
  return methods_lib.REGISTRY[method].label if method in methods_lib.REGISTRY else method


def cells(results: Sequence[dict]) -> dict[tuple[str, str], dict]:
  """{(task, method): {mean, std, success, runs, episodes}} (see the module docstring)."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in results:
    groups.setdefault((r["task"], r["method"]), []).append(r)
  out = {}
  for key, rs in groups.items():
    if len(rs) == 1:
      mean, std = rs[0]["return_mean"], rs[0]["return_std"]
    else:
      means = np.array([r["return_mean"] for r in rs])
      mean, std = float(means.mean()), float(means.std())
    out[key] = {
      "mean": float(mean),
      "std": float(std),
      "success": float(np.mean([r["success"] for r in rs])),
      "runs": len(rs),
      "episodes": int(sum(r["episodes"] for r in rs)),
      "env": rs[0].get("env", "scienceworld"),
    }
  return out


def _layout(cell: dict):
  """(methods, [(topic, task)], per-method average over tasks) for table 1."""
  meth = _method_order([m for _, m in cell])
  tasks = sorted({t for t, _ in cell}, key=_task_order)
  rows = [(topic_of(t, cell[next(k for k in cell if k[0] == t)]["env"]), t) for t in tasks]
  avg = {}
  for m in meth:
    means = [cell[(t, m)]["mean"] for t in tasks if (t, m) in cell]
    avg[m] = float(np.mean(means)) if len(means) == len(tasks) else None
  return meth, rows, avg


def _best(values: dict) -> set:
  vals = {k: v for k, v in values.items() if v is not None}
  if not vals:
    return set()
  top = max(vals.values())
  return {k for k, v in vals.items() if np.isclose(v, top)}


def _fmt(c: dict | None, bold: bool, tex: bool = False) -> str:
  if c is None:
    return "–" if not tex else "--"
  s = f"{c['mean']:.1f} ± {c['std']:.1f}" if not tex else f"{c['mean']:.1f} $\\pm$ {c['std']:.1f}"
  if bold:
    return f"**{s}**" if not tex else f"\\textbf{{{s}}}"
  return s


def table1_markdown(cell: dict) -> str:
  meth, rows, avg = _layout(cell)
  lines = [
    "| Topic | Task | " + " | ".join(_label(m) for m in meth) + " |",
    "|---|---|" + "---|" * len(meth),
  ]
  prev = None
  for topic, task in rows:
    best = _best({m: cell[(task, m)]["mean"] if (task, m) in cell else None for m in meth})
    cols = [_fmt(cell.get((task, m)), m in best) for m in meth]
    lines.append(f"| {topic if topic != prev else ''} | {task} | " + " | ".join(cols) + " |")
    prev = topic
  best = _best(avg)
  cols = [
    ("–" if avg[m] is None else (f"**{avg[m]:.1f}**" if m in best else f"{avg[m]:.1f}"))
    for m in meth
  ]
  lines.append("| | **Average** | " + " | ".join(cols) + " |")
  return "\n".join(lines) + "\n"


def table1_csv(cell: dict) -> str:
  meth, rows, _ = _layout(cell)
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(
    ["topic", "task", "method", "label", "return_mean", "return_std", "success", "runs", "episodes"]
  )
  for topic, task in rows:
    for m in meth:
      c = cell.get((task, m))
      if c is not None:
        w.writerow(
          [
            topic,
            task,
            m,
            _label(m),
            f"{c['mean']:.4f}",
            f"{c['std']:.4f}",
            f"{c['success']:.4f}",
            c["runs"],
            c["episodes"],
          ]
        )
  return buf.getvalue()


def _tex_escape(s: str) -> str:
  return s.replace("_", "\\_").replace("&", "\\&").replace("%", "\\%")


def table1_latex(cell: dict) -> str:
  meth, rows, avg = _layout(cell)
  lines = [
    "\\begin{tabular}{ll" + "c" * len(meth) + "}",
    "\\toprule",
    "Topic & Task & " + " & ".join(_tex_escape(_label(m)) for m in meth) + " \\\\",
    "\\midrule",
  ]
  prev = None
  for topic, task in rows:
    best = _best({m: cell[(task, m)]["mean"] if (task, m) in cell else None for m in meth})
    cols = [_fmt(cell.get((task, m)), m in best, tex=True) for m in meth]
    name = _tex_escape(topic) if topic != prev else ""
    lines.append(f"{name} & {_tex_escape(task)} & " + " & ".join(cols) + " \\\\")
    prev = topic
  best = _best(avg)
  cols = [
    "--" if avg[m] is None else (f"\\textbf{{{avg[m]:.1f}}}" if m in best else f"{avg[m]:.1f}")
    for m in meth
  ]
  lines += [
    "\\midrule",
    " & Average & " + " & ".join(cols) + " \\\\",
    "\\bottomrule",
    "\\end{tabular}",
  ]
  return "\n".join(lines) + "\n"


def table2(cell: dict) -> tuple[str, str, str]:
  """WebShop: (markdown, csv, latex) with one row per method, score and success (%), the best of
  each column in bold. Several WebShop tasks are averaged per method."""
  meth = _method_order([m for _, m in cell])
  score = {m: float(np.mean([c["mean"] for (t, mm), c in cell.items() if mm == m])) for m in meth}
  succ = {
    m: 100 * float(np.mean([c["success"] for (t, mm), c in cell.items() if mm == m])) for m in meth
  }
  bs, bq = _best(score), _best(succ)
  md = ["| Method | Score | Success (%) |", "|---|---|---|"]
  tex = ["\\begin{tabular}{lcc}", "\\toprule", "Method & Score & Success (\\%) \\\\", "\\midrule"]
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(["method", "label", "score", "success"])

  def bold(text, on, tex=False):
    if not on:
      return text
    return "\\textbf{" + text + "}" if tex else f"**{text}**"

  for m in meth:
    s, q = f"{score[m]:.1f}", f"{succ[m]:.1f}"
    md.append(f"| {_label(m)} | {bold(s, m in bs)} | {bold(q, m in bq)} |")
    tex.append(
      f"{_tex_escape(_label(m))} & {bold(s, m in bs, True)} & {bold(q, m in bq, True)} \\\\"
    )
    w.writerow([m, _label(m), f"{score[m]:.4f}", f"{succ[m] / 100:.4f}"])
  tex += ["\\bottomrule", "\\end{tabular}"]
  return "\n".join(md) + "\n", buf.getvalue(), "\n".join(tex) + "\n"


def write_tables(results: Sequence[dict], out) -> str:
  """Writes the tables into `out`; returns the markdown of both."""
  out = epath.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  shop = [r for r in results if r.get("env") == WEBSHOP]
  rest = [r for r in results if r.get("env") != WEBSHOP]
  text = ""
  if rest:
    c = cells(rest)
    md = table1_markdown(c)
    (out / "table1.md").write_text(md)
    (out / "table1.csv").write_text(table1_csv(c))
    (out / "table1.tex").write_text(table1_latex(c))
    text += md
  if shop:
    md, cs, tex = table2(cells(shop))
    (out / "table2.md").write_text(md)
    (out / "table2.csv").write_text(cs)
    (out / "table2.tex").write_text(tex)
    text += ("\n" if text else "") + md
  return text


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--runs", required=True, help="comma-separated run directories or sweep roots")
  ap.add_argument("--out", required=True, help="directory for table1.{md,csv,tex}, table2.*")
  ap.add_argument("--import", dest="imports", action="append", default=[], help=cli.IMPORT_HELP)
  args = ap.parse_args(argv)
  cli.import_modules(args.imports)  # a user's method: its column and label
  try:
    results = read_results([p for p in args.runs.split(",") if p])
  except FileNotFoundError as e:
    cli.fail(e)  # one line, exit 2
  print(write_tables(results, args.out), end="")


if __name__ == "__main__":
  cli.guard(main)  # one-line errors for config and path mistakes (exit 2)
