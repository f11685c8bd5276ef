"""PNG plots from runs' metrics.jsonl: return and success per iteration (one line per run on one
axis, as the paper's Figures 1a/9/10), policy entropy, and the time per phase (Figure 12's bars).

  python launch/plot.py --workdirs=runs/empo2,runs/grpo --out=runs/plots
  python launch/plot.py --workdirs=runs/pq --out=runs/pq/plots      # a sweep root: all its runs

Writes returns.png, entropy.png, time_per_phase.png and comparison.png (all four panels) into --out,
and exploration.png (return, success, eval Pass@1 / Pass@k, policy entropy: the exploration
methods side by side, configs/sweeps.py:exploration); --table prints a markdown table of the runs.
A workdir without metrics.jsonl but with subdirectories that have one stands for those runs.
Workdirs and --out are etils.epath paths: local or gs://.
"""

from __future__ import annotations

import argparse
import io

import numpy as np
from etils import epath

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, ScalarFormatter  # noqa: E402
from empo2_jax import cli  # noqa: E402

PHASE_SKIP = ("time/iteration",)  # the total, not a phase
MARKERS = "osD^vP*Xh<>"  # runs that coincide stay visible
ENV_STEPS = "env_steps_total"  # read_run: the cumulative env_steps metric (--x=env_steps)
X_AXES = {"iteration": "iteration", "env_steps": ENV_STEPS}


def read_run(workdir) -> list[dict]:
  from empo2_jax.train.metrics import read_metrics

  records = read_metrics(workdir)
  last = {}
  for r in records:  # a resumed run may repeat an iteration: keep the last
    last[int(r["iteration"])] = r
  out, total = [], 0.0
  for k in sorted(last):  # the environment steps taken up to the end of each iteration
    r = dict(last[k])
    total += r.get("env_steps", float("nan"))
    r[ENV_STEPS] = total
    out.append(r)
  return out


def find_runs(workdirs: list[str]) -> dict[str, list[dict]]:
  """{run name: its records} for train/metrics.run_dirs(workdirs)."""
  from empo2_jax.train.metrics import run_dirs

  return {w.name: read_run(w) for w in run_dirs(workdirs)}


def series(records: list[dict], key: str, x: str = "iteration") -> tuple[np.ndarray, np.ndarray]:
  """(x, y) of the records with a finite `key` (and a finite x: runs from before the env_steps
  metric have no environment-step axis)."""
  xk = X_AXES[x]
  pts = [
    (r[xk], r[key])
    for r in records
    if isinstance(r.get(key), (int, float)) and np.isfinite(r[key]) and np.isfinite(r[xk])
  ]
  if not pts:
    return np.zeros(0), np.zeros(0)
  x, y = zip(*pts)
  return np.asarray(x, float), np.asarray(y, float)


def smooth(y: np.ndarray, window: int) -> np.ndarray:
  if window <= 1 or len(y) < 2:
    return y
  out = np.empty_like(y)
  for i in range(len(y)):
    out[i] = y[max(0, i - window + 1) : i + 1].mean()
  return out


def plot_lines(ax, runs, key, title, window, eval_key=None, x_axis="iteration"):
  drawn = False
  for i, (name, recs) in enumerate(runs.items()):
    color = f"C{i % 10}"
    x, y = series(recs, key, x_axis)
    if len(x):
      ax.plot(
        x,
        smooth(y, window),
        color=color,
        label=name,
        lw=1.6,
        marker=MARKERS[i % len(MARKERS)],
        ms=9 - 1.5 * (i % 4),
        mfc="none",
      )
      drawn = True
    if eval_key:
      x, y = series(recs, eval_key, x_axis)
      if len(x):
        ax.plot(x, y, color=color, ls="--", marker="o", ms=3, lw=1, label=f"{name} (eval)")
        drawn = True
  ax.set_title(title)
  ax.set_xlabel("environment steps" if x_axis == "env_steps" else "iteration")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  fmt = ScalarFormatter(useOffset=False)
  fmt.set_scientific(False)
  ax.yaxis.set_major_formatter(fmt)
  ax.grid(alpha=0.3)
  if drawn:
    ax.legend(fontsize=7)
  else:
    ax.text(0.5, 0.5, f"no {key} in these runs", ha="center", va="center", transform=ax.transAxes)


def plot_passk(ax, runs, window):
  """Eval Pass@k (solid) and Pass@1 (dashed) per run (Trainer.evaluate: k = train.eval_repeats)."""
  drawn = False
  for i, (name, recs) in enumerate(runs.items()):
    k = next((int(r["eval/k"]) for r in recs if r.get("eval/k")), 0)
    for key, ls, label in (("eval/pass@k", "-", f"{name} pass@{k}"), ("eval/pass@1", "--", None)):
      x, y = series(recs, key)
      if len(x):
        ax.plot(x, smooth(y, window), color=f"C{i % 10}", ls=ls, marker=MARKERS[i % 10], ms=5,
                mfc="none", label=label or f"{name} pass@1")  # fmt: skip
        drawn = True
  ax.set_title("eval Pass@k (solid) and Pass@1 (dashed)")
  ax.set_xlabel("iteration")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.grid(alpha=0.3)
  if drawn:
    ax.legend(fontsize=6)
    # the runs' whole iteration range, as in the other panels (evaluations may be at one iteration)
    its = [r["iteration"] for recs in runs.values() for r in recs if "iteration" in r]
    lo, hi = min(its), max(its)
    pad = 0.1 * (hi - lo + 1)
    ax.set_xlim(lo - pad, hi + pad)
  else:
    ax.text(0.5, 0.5, "no eval/pass@k in these runs", ha="center", va="center",
            transform=ax.transAxes)  # fmt: skip


TABLE_KEYS = (
  ("iterations", None),
  ("train return (mean)", "return_mean"),
  ("train success (mean)", "success"),
  ("eval return (last)", "eval/return_mean"),
  ("eval success (last)", "eval/success"),
  ("eval pass@1 (last)", "eval/pass@1"),
  ("eval pass@k (last)", "eval/pass@k"),
  ("entropy (mean)", "loss/entropy"),
  ("s / iteration", "time/iteration"),
)


def table(runs: dict) -> str:
  """Markdown: one row per run; train metrics averaged over iterations, eval ones the last."""
  head = "| run | " + " | ".join(k for k, _ in TABLE_KEYS) + " |"
  lines = [head, "|" + "---|" * (len(TABLE_KEYS) + 1)]
  for name, recs in runs.items():
    cells = []
    for label, key in TABLE_KEYS:
      if key is None:
        cells.append(str(len(recs)))
        continue
      _, y = series(recs, key)
      if not len(y):
        cells.append("-")
      else:
        cells.append(f"{(y[-1] if label.endswith('(last)') else y.mean()):.3g}")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def phase_means(recs: list[dict], skip_first: bool = True) -> dict[str, float]:
  """Mean seconds per phase; the first iteration (compilation) is left out when there are more."""
  if skip_first and len(recs) > 1:
    recs = recs[1:]
  keys = sorted({k for r in recs for k in r if k.startswith("time/") and k not in PHASE_SKIP})
  return {
    k: float(np.mean([r[k] for r in recs if isinstance(r.get(k), (int, float))])) for k in keys
  }


def plot_phases(ax, runs):
  phases = {name: phase_means(recs) for name, recs in runs.items()}
  keys = sorted({k for p in phases.values() for k in p})
  names = list(runs)
  bottom = np.zeros(len(names))
  for j, k in enumerate(keys):
    vals = np.array([phases[n].get(k, 0.0) for n in names])
    ax.bar(names, vals, bottom=bottom, label=k[len("time/") :], color=f"C{j % 10}")
    bottom += vals
  ax.set_title("time per iteration by phase (mean of iterations >= 2)")
  ax.set_ylabel("seconds")
  ax.tick_params(axis="x", labelrotation=20, labelsize=7)
  if keys:
    ax.legend(fontsize=7)


def make_plots(runs: dict, out, window: int = 1, dpi: int = 100, x: str = "iteration") -> list[str]:
  out = epath.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  paths = []

  def save(fig, name):
    fig.tight_layout()
    buf = io.BytesIO()  # rendered here, written through epath (gs:// has no local file to open)
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    (out / name).write_bytes(buf.getvalue())
    paths.append(str(out / name))

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  title = "return (training rollouts)"
  plot_lines(axes[0], runs, "return_mean", title, window, eval_key="eval/return_mean", x_axis=x)
  plot_lines(axes[1], runs, "success", "success rate", window, eval_key="eval/success", x_axis=x)
  save(fig, "returns.png")
  fig, ax = plt.subplots(figsize=(6, 4))
  plot_lines(ax, runs, "loss/entropy", "policy entropy", window)
  save(fig, "entropy.png")
  fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(runs)), 4))
  plot_phases(ax, runs)
  save(fig, "time_per_phase.png")
  fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
  plot_lines(axes[0, 0], runs, "return_mean", "return", window, eval_key="eval/return_mean")
  plot_lines(axes[0, 1], runs, "success", "success rate", window, eval_key="eval/success")
  plot_lines(axes[1, 0], runs, "loss/entropy", "policy entropy", window)
  plot_phases(axes[1, 1], runs)
  save(fig, "comparison.png")
  fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
  plot_lines(axes[0, 0], runs, "return_mean", "return", window, eval_key="eval/return_mean")
  plot_lines(axes[0, 1], runs, "success", "success rate", window, eval_key="eval/success")
  plot_passk(axes[1, 0], runs, window)
  plot_lines(axes[1, 1], runs, "loss/entropy", "policy entropy", window)
  save(fig, "exploration.png")
  return paths


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdirs", required=True, help="comma-separated run workdirs or sweep roots")
  p.add_argument("--out", required=True, help="directory for the PNG files")
  p.add_argument("--smooth", type=int, default=1, help="moving-average window (iterations)")
  p.add_argument("--dpi", type=int, default=100)
  p.add_argument(
    "--x",
    choices=sorted(X_AXES),
    default="iteration",
    help="returns.png's x axis: iterations, or environment steps (the env_steps metric summed)",
  )
  p.add_argument("--table", action="store_true", help="also print a markdown table of the runs")
  args = p.parse_args(argv)
  runs = find_runs([w for w in args.workdirs.split(",") if w])
  if args.table:
    print(table(runs))
  for path in make_plots(runs, args.out, args.smooth, args.dpi, args.x):
    print(path)
  return 0


if __name__ == "__main__":
  cli.guard(main)  # one-line errors for config and path mistakes (exit 2)
