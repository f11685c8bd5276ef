"""Regenerate docs/aot_table.md's table: run launch/aot.py for every row and print the markdown.

  python scripts/aot_table.py                 # every row (each a 7B-72B compile: minutes apiece)
  python scripts/aot_table.py --rows 7 8      # only these rows (1-based, as printed by --list)
  python scripts/aot_table.py --list          # the rows and their launch/aot.py flags

Needs libtpu (requirements-dev.txt pins the one `pip install ".[tpu]"` installs); runs on a CPU
machine. Each row is exactly one launch/aot.py command, so a row of the table equals that
command's output; the last line names the libtpu and jax versions the rows were compiled with.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LM = "--program=lm_train_step --batch=128 --seq=4500"
TS = "--program=train_step --batch=128 --seq=4532"

# (label, flags): the table's rows, in order
ROWS = (
  ("0.5B", f"{LM} --no_cost_probe --preset=0.5b --topology=v5e:2x4 --microbatches=16"),
  (
    "0.5B, remat `none`",
    f"{LM} --no_cost_probe --preset=0.5b --topology=v5e:2x4 --microbatches=16 --remat=none",
  ),
  ("1.5B", f"{LM} --no_cost_probe --preset=1.5b --topology=v5e:2x4 --microbatches=16"),
  ("7B", f"{LM} --no_cost_probe --preset=7b --topology=v5e:2x4 --microbatches=16"),
  (
    "7B, bf16 params + moments (memory what-if: training refuses it)",
    f"{LM} --no_cost_probe --preset=7b --topology=v5e:2x4 --microbatches=16 --param_dtype=bfloat16",
  ),
  ("7B", f"{LM} --preset=7b --topology=v5p:2x2x1 --microbatches=32"),
  (
    "7B, `train_step`, 1 mini-batch (128 samples), default config",
    f"{TS} --preset=7b --topology=v5p:2x2x1",
  ),
  (
    "7B, `train_step`, 20 mini-batches (2560 samples)",
    "--program=train_step --batch=2560 --seq=4532 --preset=7b --topology=v5p:2x2x1 --no_cost_probe",
  ),
  ("14B", f"{LM} --preset=14b --topology=v5p:2x2x2 --microbatches=16"),
  ("32B", f"{LM} --no_cost_probe --preset=32b --topology=v5p:2x2x2 --microbatches=16"),
  ("32B", f"{LM} --no_cost_probe --preset=32b --topology=v5p:2x2x4 --microbatches=8"),
  ("72B", f"{LM} --no_cost_probe --preset=72b --topology=v5p:2x2x1 --microbatches=32"),
)

# The slices researchers mostly have, at the default config's update (`train_step`, 128 samples of
# 4532 tokens, 16 micro-batches): full fine-tuning (fp32 params and AdamW moments) and LoRA of
# rank 16 and 64 on all-linear (bf16 frozen base, fp32 adapters and their moments). v4:2x2x1 is
# compiled as a v4-8 VM presents it: 4 megacore devices of 32 GiB (programs/aot.CHIP_CONFIG).
SLICES = ("v4:2x2x1", "v5e:2x4", "v6e:2x4", "v5p:2x2x1")
SLICE_PRESETS = (("0.5B", "0.5b"), ("1.5B", "1.5b"), ("7B", "7b"), ("14B", "14b"))
TRAINING = (
  ("full", ""),
  ("LoRA r16", " --lora_rank=16 --param_dtype=bfloat16"),
  ("LoRA r64", " --lora_rank=64 --param_dtype=bfloat16"),
)
ROWS += tuple(
  (
    f"{label}, `train_step`, {what}",
    f"{TS} --no_cost_probe --preset={preset} --topology={t}{extra}",
  )
  for label, preset in SLICE_PRESETS
  for t in SLICES
  for what, extra in TRAINING
)

HEAD = (
  "| preset | topology (chips) | micro-batches | per-chip GiB | HBM GiB | fits | est. step s | "
  "est. MFU |\n|---|---|---|---|---|---|---|---|"
)


def parse(text: str) -> dict:
  """The figures of launch/aot.py's report."""
  out = {}
  m = re.search(r"topology (\S+): (\d+) chips", text)
  out["topology"], out["chips"] = (m.group(1), m.group(2)) if m else ("?", "?")
  m = re.search(r"micro-batches (\d+)", text)
  out["micro"] = m.group(1) if m else "?"
  m = re.search(r"per chip: (at least )?([\d.]+) GiB of ([\d.]+) GiB", text)
  out["gib"] = (">= " if m and m.group(1) else "") + (f"{float(m.group(2)):.2f}" if m else "?")
  out["hbm"] = m.group(3) if m else "?"
  out["fits"] = "yes" if "-> fits" in text else "**no**"
  m = re.search(r"estimated ([\d.]+)s per call", text)
  out["est_s"] = f"{float(m.group(1)):.1f}" if m else "–"
  m = re.search(r"est_mfu=([\d.]+)", text)
  out["mfu"] = f"{float(m.group(1)):.2f}" if m else "–"
  m = re.search(r"^compiler: (.+)$", text, re.M)
  out["compiler"] = m.group(1) if m else None
  return out


def run_row(label: str, flags: str) -> tuple[str, str | None]:
  """The row's markdown and the compiler launch/aot.py names ("libtpu X with jax Y")."""
  cmd = [sys.executable, os.path.join(ROOT, "launch", "aot.py"), *flags.split()]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  if out.returncode != 0:
    return f"| {label} | error: {out.stderr.strip().splitlines()[-1:]} |", None
  f = parse(out.stdout)
  if f["micro"] == "?":  # a program that does not fit prints no micro-batch line
    m = re.search(r"--microbatches=(\d+)", flags)
    f["micro"] = m.group(1) if m else "?"
  row = (
    f"| {label} | {f['topology']} ({f['chips']}) | {f['micro']} | {f['gib']} | {f['hbm']} | "
    f"{f['fits']} | {f['est_s']} | {f['mfu']} |"
  )
  return row, f["compiler"]


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rows", type=int, nargs="*", help="1-based rows to run (default: all)")
  ap.add_argument("--list", action="store_true", help="print the rows and their flags")
  a = ap.parse_args()
  if a.list:
    for i, (label, flags) in enumerate(ROWS, 1):
      print(f"{i:2d}  {label}: python launch/aot.py {flags}")
    return 0
  picks = a.rows or range(1, len(ROWS) + 1)
  print(HEAD)
  compilers = set()
  for i in picks:
    row, compiler = run_row(*ROWS[i - 1])
    print(row, flush=True)
    if compiler:
      compilers.add(compiler)
  # the table's header sentence names this (docs/aot_table.md)
  print(f"\nCompiled by {' / '.join(sorted(compilers)) or 'nothing (every row failed)'}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
