#!/usr/bin/env bash
# The exploration experiment: GRPO vs EMPO2 vs EMPO2 with the rule reflector, on a
# ScienceWorld task whose action FORMAT the policy knows but whose task it does not.
#
#   bash scripts/exploration_experiment.sh sft       # 1. format-only SFT (one checkpoint for all)
#   bash scripts/exploration_experiment.sh choose    # 2. the target task, measured on TRAIN rows
#   bash scripts/exploration_experiment.sh start     # 3a. the SFT start on the test variations
#   bash scripts/exploration_experiment.sh arms      # 3+4. 3 arms x 3 seeds, staged to ITERS,
#                                                    #      each stage evaluated on test variations
#   bash scripts/exploration_experiment.sh report    # 5. tables per iteration, training curves
#   bash scripts/exploration_experiment.sh archive   # 6. the small records into docs/explore/
#   bash scripts/exploration_experiment.sh all       # 1-5 in order
#
# Every step is resumable: rerunning it skips what is done (SFT and training resume from their
# workdir's newest checkpoint; an evaluation with a result.json is not redone).
#
# 1. sft: launch/sft.py with configs/sciworld.py:learn,format: SmolLM2-135M-Instruct cloned on gold
#    paths of TRAIN variations of OTHER tasks (configs/sciworld.py FORMAT_TASKS: chemistry paint
#    mixing, power component, melt, melting point, inclined plane, conductivity; their first 10
#    gold actions use look around, go to, open, pick up, move, focus on, use, examine, activate,
#    deactivate, pour, mix, connect, drop, wait1). The target's gold paths never enter the data
#    (train/sft_gold.py refuses a list that names it; <sft>/sft_data.json lists every episode).
#    The SFT does not evaluate on any test variation (sft.eval_before/after are off in `format`).
#    `format` keeps env.action_correction=always (the authors') for the RL arms and evaluations;
#    only the SFT's gold replay runs the gold actions as written (train/sft_gold.gold_env).
# 2. choose: the SFT policy (no memory, temperature train.eval_temperature = 0.4) on the first
#    CHOOSE_ROWS TRAIN variations of each candidate task (launch/eval.py --split=train); no test
#    variation is looked at. The rule, fixed before measuring: among candidates whose success
#    rate is at most 0.2 (room to improve), the highest mean return (a signal to learn from);
#    if none qualifies, the highest mean return. Written to $ROOT/target.txt (TARGET=... overrides).
# 3. arms: grpo (method=grpo, p_memory=0), empo2 (method=empo2, the paper's p=0.25, q=2/3) and
#    empo2_rule (empo2 with empo2.reflector=rule: tips built from the score gains and unmet
#    subgoals, a mechanism check; memory, modes and updates as in empo2), seeds SEEDS, all from
#    the one SFT checkpoint, cycling over the first TRAIN_ROWS (4) train variations. Each arm
#    runs the same iterations of variations_per_iter x group_size
#    episodes of at most env.max_steps steps (configs/sciworld.py:learn: 2 x 4 x 10), i.e. the
#    same environment-step budget; training is staged to each of ITERS (train.iterations raised
#    stage by stage; the run resumes from its checkpoint, checkpoint_every=1), with no in-run
#    evaluation (launch/eval.py does it in step 4).
# 4. eval: at each of ITERS (default 6), every run's checkpoint on ALL test variations of the target
#    (env.num_test_variations=10000 keeps all of them), eval_repeats=1, temperature 0.4, without memory
#    (the paper's number); the EMPO2 arms also with their memory (label <arm>_mem). The SFT
#    start itself is evaluated the same way once ($ROOT/eval/<target>/it0, label sft).
#    launch/eval.py evaluates a run's NEWEST checkpoint, so steps 3 and 4 alternate: every run
#    is trained to a stage, evaluated there, then trained on to the next stage.
# 5. report: launch/compare.py over each iteration's results (per arm: mean ± s.e. over seeds;
#    paired differences against grpo by seed and test variation, 95% intervals over pairs and
#    over seeds; the EMPO2 runs' tip usage and samples of their tips) and launch/plot.py over the
#    training runs (learning curves against environment steps).
#
# 6. archive: what the report needs, copied from $ROOT into the repository ($ARCHIVE, default
#    docs/explore/, committed), because runs/ does not outlive a checkout: every eval
#    result.json (same layout, so `ROOT=docs/explore ... report` reads it), every training run's
#    metrics.jsonl and its episodes cut to what compare/inspect read (no prompts, token ids or
#    log-probs), and the SFT's summary with the SHA-256 of each file of its hf/ checkpoint. An
#    SFT rebuilt in a later checkout is checked against that hash (`... sft` refuses a different
#    start: the arms must share one), so runs made in different checkouts share the start
#    (scripts/exploration_records.py does both).
#
# Sized for a 2-core CPU (configs/sciworld.py:learn: 15-30 min an iteration, so the
# arms are days of CPU; BASE=configs/sciworld.py:gpu,format sizes it for one accelerator).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
ROOT=${ROOT:-runs/explore}
BASE=${BASE:-configs/sciworld.py:learn,format}   # config spec before ",task=..."
SFT_DIR=$ROOT/sft
HF=$(realpath -m "$SFT_DIR/sft/hf")  # absolute: train/eval resolve it from anywhere
CANDIDATES=${CANDIDATES:-find-non-living-thing find-animal find-plant find-living-thing lifespan-longest-lived lifespan-shortest-lived}
CHOOSE_ROWS=${CHOOSE_ROWS:-20}
SEEDS=${SEEDS:-0 1 2}
ITERS=${ITERS:-6}  # docs/results.md: the sizing, fixed before the first run
# Train variations the arms cycle over (variations_per_iter = 2 a iteration, a per-epoch permutation):
# with 4, every variation recurs every second iteration, so from iteration 3 on a memory rollout
# reads tips its variation's earlier visits wrote. The first protocol kept learn's 10: in 6
# iterations a memory iteration almost always met a variation not seen before and retrieved
# nothing (docs/results.md, "Protocol 2").
TRAIN_ROWS=${TRAIN_ROWS:-4}
ARMS=${ARMS:-grpo empo2 empo2_rule}
ARCHIVE=${ARCHIVE:-docs/explore}

run() { echo "+ $*"; "$@"; }

arm_flags() {  # the config overrides of an arm
  case "$1" in
    grpo) echo "--config.method=grpo" ;;
    empo2) echo "--config.method=empo2" ;;
    empo2_rule) echo "--config.method=empo2 --config.empo2.reflector=rule" ;;
    *) echo "unknown arm $1 (valid: grpo empo2 empo2_rule)" >&2; return 1 ;;
  esac
}

target() {
  if [ -n "${TARGET:-}" ]; then echo "$TARGET"; return; fi
  [ -f "$ROOT/target.txt" ] || { echo "no $ROOT/target.txt: run the choose step first" >&2; return 1; }
  cat "$ROOT/target.txt"
}

step_sft() {
  # The learn default target (find-non-living-thing) is not among FORMAT_TASKS; the SFT data
  # does not depend on the target (sft_data.json), so one checkpoint serves every candidate.
  [ -f "$SFT_DIR/sft_summary.json" ] && { echo "sft done: $SFT_DIR"; check_sft; return; }
  run "$PY" launch/sft.py --config="$BASE" --workdir="$SFT_DIR"
  check_sft
}

check_sft() {  # the rebuilt SFT checkpoint is the archived one, byte for byte
  "$PY" scripts/exploration_records.py check "$SFT_DIR" "$ARCHIVE/sft.json"
}

step_choose() {
  for task in $CANDIDATES; do
    out=$ROOT/choose/$task
    [ -f "$out/eval/result.json" ] && continue
    run "$PY" launch/eval.py --config="$BASE,task=$task" --method=naive --split=train \
      --config.model.checkpoint="$HF" --config.env.num_train_variations="$CHOOSE_ROWS" \
      --config.train.eval_repeats=1 --config.train.eval_temperature=0.4 --workdir="$out"
  done
  "$PY" - "$ROOT" $CANDIDATES <<'EOF'
import json, sys
root, tasks = sys.argv[1], sys.argv[2:]
res = {t: json.load(open(f"{root}/choose/{t}/eval/result.json")) for t in tasks}
for t, r in res.items():
  assert r["split"] == "train", f"{t}: not a train-variation evaluation"
  print(f"{t}: return {r['return_mean']:.1f} +- {r['return_std']:.1f} success {r['success']:.2f}"
        f" ({r['episodes']} train variations)")
room = [t for t in tasks if res[t]["success"] <= 0.2]
pick = max(room or tasks, key=lambda t: res[t]["return_mean"])
open(f"{root}/target.txt", "w").write(pick + "\n")
print(f"target={pick} (rule: highest return among success <= 0.2{'' if room else '; none: all'})")
EOF
}

done_iters() {  # completed iterations of a run: its newest checkpoint step (0: none)
  local d=$1/checkpoints
  { ls "$d" 2> /dev/null | grep -E '^[0-9]+$' || true; } | sort -n | tail -1 | grep . || echo 0
}

train_to() {  # train_to ARM SEED ITER: the run resumed up to ITER completed iterations
  local arm=$1 seed=$2 it=$3 task run_dir
  task=$(target)
  run_dir=$ROOT/arms/$task/${arm}_s$seed
  [ "$(done_iters "$run_dir")" -ge "$it" ] && return
  # shellcheck disable=SC2046
  run "$PY" launch/train.py --config="$BASE,task=$task" $(arm_flags "$arm") \
    --config.seed="$seed" --config.model.checkpoint="$HF" --config.env.num_train_variations="$TRAIN_ROWS" \
    --config.train.iterations="$it" --config.train.eval_every=0 \
    --config.train.eval_at_end=False --config.train.checkpoint_every=1 \
    --config.train.keep_checkpoints=2 --config.train.save_episodes=True --workdir="$run_dir"
}

check_iteration() {  # check_iteration RESULT_JSON ITER: the evaluation saw iteration ITER
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
path, want = sys.argv[1], int(sys.argv[2])
got = json.load(open(path))["iteration"]
if got != want:
  sys.exit(f"{path}: iteration {got}, not {want}: the run is past this stage (stages in order)")
EOF
}

eval_at() {  # eval_at ARM SEED ITER: test variations, no memory (and with memory for EMPO2)
  local arm=$1 seed=$2 it=$3 task run_dir out
  task=$(target)
  run_dir=$ROOT/arms/$task/${arm}_s$seed
  out=$ROOT/eval/$task/it$it
  local settings="without"
  [ "$arm" != grpo ] && settings="without with"
  for mem in $settings; do
    local label=$arm
    [ "$mem" = with ] && label=${arm}_mem
    local dest=$out/${label}_s$seed
    [ -f "$dest/eval/result.json" ] && continue
    # shellcheck disable=SC2046
    run "$PY" launch/eval.py --config="$BASE,task=$task" $(arm_flags "$arm") \
      --config.seed="$seed" --config.model.checkpoint="$HF" \
      --config.env.num_test_variations=10000 --config.train.eval_repeats=1 \
      --config.train.eval_temperature=0.4 --memory="$mem" --label="$label" \
      --workdir="$run_dir" --out="$dest"
    check_iteration "$dest/eval/result.json" "$it"
  done
}

eval_sft_start() {  # the SFT policy on the same test variations: the arms' common start
  local task dest
  task=$(target)
  dest=$ROOT/eval/$task/it0/sft
  [ -f "$dest/eval/result.json" ] && return
  run "$PY" launch/eval.py --config="$BASE,task=$task" --method=naive --label=sft \
    --config.model.checkpoint="$HF" --config.env.num_test_variations=10000 \
    --config.train.eval_repeats=1 --config.train.eval_temperature=0.4 \
    --workdir="$dest" --out="$dest"
}

step_arms() {  # stage by stage: every run to ITER, evaluated at ITER, then the next stage
  eval_sft_start
  for it in $ITERS; do
    for seed in $SEEDS; do
      for arm in $ARMS; do
        train_to "$arm" "$seed" "$it"
        eval_at "$arm" "$seed" "$it"
      done
    done
  done
}

step_report() {
  local task
  task=$(target)
  run "$PY" launch/table.py --runs="$ROOT/eval/$task/it0" --out="$ROOT/report/it0"  # the start
  for it in $ITERS; do
    run "$PY" launch/compare.py --runs="$ROOT/eval/$task/it$it" --baseline=grpo \
      --workdirs="$ROOT/arms/$task" --out="$ROOT/report/it$it"
  done
  run "$PY" launch/plot.py --workdirs="$ROOT/arms/$task" --out="$ROOT/report/plots" --table \
    --x=env_steps
}

step_archive() {  # the report's inputs, small, into $ARCHIVE (committed)
  "$PY" scripts/exploration_records.py archive "$ROOT" "$ARCHIVE"
}

case "${1:-}" in
  sft) step_sft ;;
  choose) step_choose ;;
  start) eval_sft_start ;;
  arms) step_arms ;;
  report) step_report ;;
  archive) step_archive ;;
  all)
    step_sft
    step_choose
    step_arms
    step_report
    ;;
  *)
    echo "usage: $0 sft|choose|start|arms|report|archive|all (env: PY ROOT BASE CANDIDATES CHOOSE_ROWS" \
      "SEEDS ITERS ARMS TARGET ARCHIVE)" >&2
    exit 2
    ;;
esac
