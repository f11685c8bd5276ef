#!/usr/bin/env bash
# ScienceWorld with oracle tips (docs/vault_bench.md, "ScienceWorld with oracle tips"): each
# training variation's tip is its gold path (config memory.oracle). First the gap: does the start
# succeed more often with that tip than without it? Only where it does, by at least GAP_PP points,
# the arms: F+ (context distillation with EDGE's gate) against D (on-policy without tips), scored
# tip-free on the variations they train on. Every step is resumable: rerunning skips what is done.
#
#   bash scripts/sciworld_oracle_experiment.sh sft      # 1. the format-only SFT start
#   bash scripts/sciworld_oracle_experiment.sh gap      # 2. the start with / without oracle tips
#   bash scripts/sciworld_oracle_experiment.sh arms     # 3. ARMS x SEEDS (only if the gap holds)
#   bash scripts/sciworld_oracle_experiment.sh evals    # 4. each arm's end, tip-free
#   bash scripts/sciworld_oracle_experiment.sh report   # 5. the gap and the arms' table
#
# 1. sft: scripts/exploration_experiment.sh sft (SmolLM2-135M-Instruct, configs/sciworld.py:
#    learn,format), checked byte for byte against START_ARCHIVE/sft.json (the memory-distillation
#    experiment's start, docs/memory_distill/sft.json, by default).
# 2. gap: launch/eval.py --initial on the first TRAIN_ROWS train variations, REPEATS episodes
#    each at temperature 0.4, with the oracle memory and without (--memory=both); ARCHIVE/gap.json
#    keeps both rates, each episode's outcome and `holds` (with-tip minus tip-free success >=
#    GAP_PP points).
# 3. arms, from the start with the oracle memory (frozen) and the rule reflector, on the same
#    TRAIN_ROWS variations, ITERS iterations of the base config's 2 variations x 4 rollouts:
#      D   empo2, force_mode=on: on-policy without tips (the control)
#      F+  ctx_distill, force_mode=off, ctx_distill.edge_gate=True: tip-free sampling with shadow
#          retrieval, reverse KL to the model given the gold-path tip where EDGE's gate opens
#    Refused when ARCHIVE/gap.json does not hold (FORCE=1 runs them anyway).
# 4. evals: each arm's last checkpoint WITHOUT memory on the TRAIN_ROWS variations, REPEATS
#    episodes each at temperature 0.4 (ARCHIVE/evals/<arm>_s<seed>.json).
# 5. report: the gap, and per arm the tip-free success on the trained variations; F+ minus D
#    paired by seed with a 95% t-interval.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
ROOT=${ROOT:-runs/sciworld_oracle}
BASE=${BASE:-configs/sciworld.py:learn,format}
TASK=${TASK:-find-non-living-thing}
TRAIN_ROWS=${TRAIN_ROWS:-4}
REPEATS=${REPEATS:-8}
SEEDS=${SEEDS:-0 1 2}
ITERS=${ITERS:-5}
ARMS=${ARMS:-D F+}
GAP_PP=${GAP_PP:-25}
START_ARCHIVE=${START_ARCHIVE:-docs/memory_distill}
ARCHIVE=${ARCHIVE:-docs/sciworld_oracle}
HF=$(realpath -m "$ROOT/sft/sft/hf")
CFG="$BASE,task=$TASK"

run() { echo "+ $*"; "$@"; }

common() {
  echo "--config=$CFG --config.empo2.reflector=rule --config.model.checkpoint=$HF" \
    "--config.env.num_train_variations=$TRAIN_ROWS --config.memory.oracle=True" \
    "--config.memory.frozen=True"
}

arm_flags() {
  case "$1" in
    D) echo "--config.method=empo2 --config.empo2.force_mode=on" ;;
    F+) echo "--config.method=ctx_distill --config.empo2.force_mode=off" \
      "--config.ctx_distill.edge_gate=True" ;;
    *) echo "unknown arm $1 (valid: D F+)" >&2; return 1 ;;
  esac
}

done_iters() {
  { ls "$1/checkpoints" 2> /dev/null | grep -E '^[0-9]+$' || true; } | sort -n | tail -1 | grep . || echo 0
}

step_sft() {
  ROOT=$ROOT ARCHIVE=$START_ARCHIVE PY=$PY BASE=$BASE run bash scripts/exploration_experiment.sh sft
}

step_gap() {
  mkdir -p "$ARCHIVE"
  if [ ! -f "$ROOT/gap/episodes/with.jsonl" ]; then
    # shellcheck disable=SC2046
    run "$PY" launch/eval.py $(common) --method=empo2 --initial --memory=both --split=train \
      --config.train.eval_repeats="$REPEATS" --config.train.eval_temperature=0.4 \
      --label=oracle_gap --workdir="$ROOT/gap" --episodes="$ROOT/gap/episodes"
  fi
  "$PY" - "$ROOT/gap/episodes" "$ARCHIVE/gap.json" "$GAP_PP" <<'EOF'
import json, sys
from empo2_jax.memory.oracle import oracle_actions
src, dst, gap_pp = sys.argv[1], sys.argv[2], float(sys.argv[3])
keep = ("variation", "use_memory", "score", "success", "env_failed")
eps = {k: [json.loads(l) for l in open(f"{src}/{k}.jsonl")] for k in ("with", "without")}
assert all(e["tips"] for e in eps["with"]), "an episode with memory was shown no oracle tip"
rate = {k: sum(e["success"] for e in v) / len(v) for k, v in eps.items()}
gap = rate["with"] - rate["without"]
gold = {e["variation"]: oracle_actions(e["tips"][0]) for e in eps["with"]}


def in_order(e):  # how many of the gold path's actions the episode executed, in order
  k, g = 0, gold[e["variation"]]
  for a in e["turns"]["executed_action"]:
    k += k < len(g) and a == g[k]
  return k


out = {"with_tips": rate["with"], "tip_free": rate["without"], "gap": gap,
       "gap_pp_needed": gap_pp, "holds": bool(100 * gap >= gap_pp), "gold_paths": gold,
       "episodes": {k: [{**{f: e[f] for f in keep}, "gold_in_order": in_order(e)} for e in v]
                    for k, v in eps.items()}}
json.dump(out, open(dst, "w"), indent=1)
follow = {k: sum(e["gold_in_order"] for e in v) / len(v) for k, v in out["episodes"].items()}
print(f"gap: with oracle tips {out['with_tips']:.3f}, without {out['tip_free']:.3f}, "
      f"gap {gap:+.3f} (needs >= {gap_pp / 100:.2f}): holds={out['holds']}; gold actions "
      f"executed in order, mean: with {follow['with']:.3f}, without {follow['without']:.3f}")
EOF
}

gap_holds() {
  "$PY" -c "import json,sys; sys.exit(0 if json.load(open('$ARCHIVE/gap.json'))['holds'] else 1)"
}

step_arms() {
  if ! gap_holds && [ "${FORCE:-0}" != 1 ]; then
    echo "the gap does not hold ($ARCHIVE/gap.json): the arms are not run (FORCE=1 runs them)"
    return 0
  fi
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local dir=$ROOT/arms/${arm}_s$seed
      [ "$(done_iters "$dir")" -ge "$ITERS" ] && continue
      # shellcheck disable=SC2046
      run "$PY" launch/train.py $(common) $(arm_flags "$arm") --config.seed="$seed" \
        --config.train.iterations="$ITERS" --config.train.eval_every=0 \
        --config.train.eval_at_end=False --config.train.checkpoint_every=1 \
        --config.train.keep_checkpoints=1 --workdir="$dir"
      mkdir -p "$ARCHIVE/arms"
      cp "$dir/metrics.jsonl" "$ARCHIVE/arms/${arm}_s$seed.metrics.jsonl"
    done
  done
}

step_evals() {
  mkdir -p "$ARCHIVE/evals"
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local dir=$ROOT/arms/${arm}_s$seed dest=$ARCHIVE/evals/${arm}_s$seed.json
      [ "$(done_iters "$dir")" -ge "$ITERS" ] || continue
      [ -f "$dest" ] && continue
      # shellcheck disable=SC2046
      run "$PY" launch/eval.py $(common) --split=train --memory=without \
        --config.train.eval_repeats="$REPEATS" --config.train.eval_temperature=0.4 \
        --label="$arm" --workdir="$dir" --out="$ROOT/evals/${arm}_s$seed"
      cp "$ROOT/evals/${arm}_s$seed/eval/result.json" "$dest"
    done
  done
}

step_report() {
  "$PY" - "$ARCHIVE" <<'EOF'
import glob, json, os, sys
import numpy as np
from empo2_jax.train.vault_report import t_interval
arch = sys.argv[1]
gap = json.load(open(f"{arch}/gap.json"))
print(f"gap: with oracle tips {gap['with_tips']:.3f}, tip-free {gap['tip_free']:.3f}, "
      f"{gap['gap']:+.3f}; holds: {gap['holds']}")
succ = {}
for p in sorted(glob.glob(f"{arch}/evals/*.json")):
  arm, seed = os.path.basename(p)[:-5].rsplit("_s", 1)
  succ.setdefault(arm, {})[int(seed)] = json.load(open(p))["success"]
if not succ:
  print("no arm evaluated")
  sys.exit(0)
print("| arm | seeds | tip-free success, trained variations | F+ - D (95% t) |")
print("|---|---|---|---|")
for arm, s in succ.items():
  cell = "-"
  if arm != "D" and "D" in succ:
    both = sorted(set(s) & set(succ["D"]))
    mean, low, high = t_interval([s[k] - succ["D"][k] for k in both])
    if len(both) > 1:
      cell = f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"
    elif both:
      cell = f"{mean:+.3f} (one seed)"
  print(f"| {arm} | {len(s)} | {np.mean(list(s.values())):.3f} | {cell} |")
EOF
}

case "${1:-}" in
  sft) step_sft ;;
  gap) step_gap ;;
  arms) step_arms ;;
  evals) step_evals ;;
  report) step_report ;;
  all) step_sft; step_gap; step_arms; step_evals; step_report ;;
  *)
    echo "usage: $0 sft|gap|arms|evals|report|all (env: PY ROOT BASE TASK TRAIN_ROWS REPEATS" \
      "SEEDS ITERS ARMS GAP_PP START_ARCHIVE ARCHIVE FORCE)" >&2
    exit 2
    ;;
esac
