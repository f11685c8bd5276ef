"""The last line launch/train.py prints (the README quotes the CPU demo's):

    done iterations=3 workdir=runs/cpu mode=off return_mean=25 ... peak_rss_gib=3.64

`done_line(history, workdir, peak_rss_gib)`: the iterations run, the workdir, then the keys of
SUMMARY_KEYS that the last iteration's metrics hold, in that order, then this process's peak
resident size. Floats with 4 significant digits.
"""

from __future__ import annotations

SUMMARY_KEYS = (
  "mode",
  "return_mean",
  "success",
  "memory_size",
  "loss/pg_loss",
  "eval/return_mean",
  "eval/success",
)


def done_line(history: list[dict], workdir: str, peak_rss_gib: float) -> str:
  last = history[-1]
  fields = " ".join(
    f"{k}={last[k]:.4g}" if isinstance(last[k], float) else f"{k}={last[k]}"
    for k in SUMMARY_KEYS
    if k in last
  )
  return (
    f"done iterations={len(history)} workdir={workdir} {fields} peak_rss_gib={peak_rss_gib:.2f}"
  )
