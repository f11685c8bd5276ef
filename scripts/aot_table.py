"""Regenerate docs/aot_table.md's table: run launch/aot.py for every row and print the markdown.

  python scripts/aot_table.py                 # every row (each a 7B-72B compile: minutes apiece)
  python scripts/aot_table.py --rows 7 8      # only these rows (1-based, as printed by --list)
  python scripts/aot_table.py --list          # the rows and their launch/aot.py flags
  python scripts/aot_table.py --slices        # rows 13-60 (v4-8 / v5e-8 / v6e-8 / v5p-8) as one
                                              # table: a line per model and training, a column
                                              # per slice

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
SLICE_FIRST = len(ROWS) + 1  # the first SLICES row (1-based)
ROWS += tuple(
  (
    f"{label}, `train_step`, {what}",
    f"{TS} --no_cost_probe --preset={preset} --topology={t}{extra}",
  )
  for label, preset in SLICE_PRESETS
  for t in SLICES
  for what, extra in TRAINING
)

# The cost probe on the LoRA row that is the point of the table (libtpu's time model gives a v4
# train_step a time where it gives v5e and v5p none)
ROWS += (
  (
    "7B, `train_step`, LoRA r16, with the cost probe",
    f"{TS} --preset=7b --topology=v4:2x2x1 --lora_rank=16 --param_dtype=bfloat16",
  ),
)

# 7B with LoRA rank 16 on a v5e-8 and a v4-8 at the config's sizes (docs/tpu.md, step 4): the
# update at the longest turn sample (optim.max_prompt_len 8160 + 32 new tokens), the sampler's
# decode loop and prefill chunk for every episode of an iteration (16 x 8 rows, 8192 + 1024 slots)
LORA7 = "--preset=7b --lora_rank=16 --param_dtype=bfloat16 --no_cost_probe"
ROWS += tuple(
  (
    f"7B, `{prog}`, LoRA r16, {shape}",
    f"--program={prog} --batch=128 --seq={seq} {LORA7} --topology={t}",
  )
  for t in ("v5e:2x4", "v4:2x2x1")
  for prog, seq, shape in (
    ("train_step", 8192, "default config"),
    ("sampler", 9216, "128 rows x 9216 slots"),
    ("sampler_prefill", 9216, "128 rows x 9216 slots"),
  )
)
# ... and the sampler for 64 rows (rollout.variations_per_iter 8 x group_size 8), which a
# v5e-8 or v4-8 holds where it cannot hold 128 (the cache is 8.4 GiB a chip at 128 rows on a v5e-8)
ROWS += tuple(
  (
    f"7B, `{prog}`, LoRA r16, 64 rows x 9216 slots",
    f"--program={prog} --batch=64 --seq=9216 {LORA7} --topology={t}",
  )
  for t in ("v5e:2x4", "v4:2x2x1")
  for prog in ("sampler", "sampler_prefill")
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


def output(i: int, flags: str, saved: str | None = None) -> tuple[str | None, str | None]:
  """(launch/aot.py's stdout, None) of row i, or (None, its error's last line); with `saved`, the
  output kept in saved/row<i>.txt instead of a compile ((None, None) where there is none)."""
  if saved:
    path = os.path.join(saved, f"row{i}.txt")
    text = open(path).read() if os.path.exists(path) else ""
    return (text, None) if "\naot program=" in text else (None, None)  # a finished report
  cmd = [sys.executable, os.path.join(ROOT, "launch", "aot.py"), *flags.split()]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  if out.returncode != 0:
    return None, (out.stderr.strip().splitlines() or ["?"])[-1]
  return out.stdout, None


def run_row(label: str, flags: str, text: str | None, error: str | None) -> str:
  """The row's markdown from its output."""
  if text is None:
    topology = re.search(r"--topology=(\S+)", flags).group(1)
    return f"| {label} | {topology} | {'error: ' + error if error else 'not compiled'} |"
  f = parse(text)
  if f["micro"] == "?":  # a program that does not fit prints no micro-batch line
    m = re.search(r"--microbatches=(\d+)", flags)
    f["micro"] = m.group(1) if m else "default"
  return (
    f"| {label} | {f['topology']} ({f['chips']}) | {f['micro']} | {f['gib']} | {f['hbm']} | "
    f"{f['fits']} | {f['est_s']} | {f['mfu']} |"
  )


SLICE_HEADS = {
  "v4:2x2x1": "v4-8 (`v4:2x2x1`, 4 x 32 GiB)",
  "v5e:2x4": "v5e-8 (`v5e:2x4`, 8 x 16 GiB)",
  "v6e:2x4": "v6e-8 (`v6e:2x4`, 8 x 32 GiB)",
  "v5p:2x2x1": "v5p-8 (`v5p:2x2x1`, 4 x 95 GiB)",
}


def slice_table(cells: dict) -> str:
  """The SLICES rows as one line per (model, training), one column per slice: per-chip GiB and
  whether it fits. cells: {(model, training, topology): (output, error)}."""
  lines = [
    "| model | training | " + " | ".join(SLICE_HEADS[t] for t in SLICES) + " |",
    "|---|---|" + "---|" * len(SLICES),
  ]
  for model, _ in SLICE_PRESETS:
    for what, _ in TRAINING:
      out = []
      for t in SLICES:
        text, error = cells.get((model, what, t), (None, None))
        if text is None:
          out.append(f"error: {error}" if error else "not compiled")
        else:
          f = parse(text)
          out.append(f"{f['gib']}: {'fits' if f['fits'] == 'yes' else '**no**'}")
      lines.append(f"| {model} | {what} | " + " | ".join(out) + " |")
  return "\n".join(lines)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rows", type=int, nargs="*", help="1-based rows to run (default: all)")
  ap.add_argument("--list", action="store_true", help="print the rows and their flags")
  ap.add_argument(
    "--slices",
    action="store_true",
    help="the v4-8 / v5e-8 / v6e-8 / v5p-8 rows (or those of --rows) as one table: a line per "
    "model and training, a column per slice",
  )
  ap.add_argument("--saved", help="read row N's launch/aot.py output from SAVED/rowN.txt")
  a = ap.parse_args()
  if a.list:
    for i, (label, flags) in enumerate(ROWS, 1):
      print(f"{i:2d}  {label}: python launch/aot.py {flags}")
    return 0
  n_slices = len(SLICES) * len(SLICE_PRESETS) * len(TRAINING)
  picks = a.rows or (
    range(SLICE_FIRST, SLICE_FIRST + n_slices) if a.slices else range(1, len(ROWS) + 1)
  )
  compilers, cells = set(), {}
  if not a.slices:
    print(HEAD)
  for i in picks:
    label, flags = ROWS[i - 1]
    text, error = output(i, flags, a.saved)
    compiler = parse(text)["compiler"] if text else None
    if compiler:
      compilers.add(compiler)
    if a.slices:
      model, _, what = label.split(", ")
      cells[(model, what, re.search(r"--topology=(\S+)", flags).group(1))] = (text, error)
    else:
      print(run_row(label, flags, text, error), flush=True)
  if a.slices:
    print(slice_table(cells))
  # the table's header sentence names this (docs/aot_table.md)
  print(f"\nCompiled by {' / '.join(sorted(compilers)) or 'nothing (every row failed)'}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
