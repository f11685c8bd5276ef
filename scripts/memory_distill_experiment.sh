#!/usr/bin/env bash
# Memory into weights: EMPO2's off-policy update (paper-era and as released) against on-policy
# context distillation and OPID's hindsight token advantage, each probed on the variations it
# trains on and on unseen ones (protocol and results: docs/memory_distill.md). Every step is
# resumable: rerunning it skips what is done. ROOT must be an absolute path or one relative to
# the repository.
#
#   bash scripts/memory_distill_experiment.sh prep      # 1. start, memory, dev probe set
#   bash scripts/memory_distill_experiment.sh insample  # 2. the in-sample probe set
#   bash scripts/memory_distill_experiment.sh arms      # 3. ARMS x SEEDS, ITERS iterations each
#   bash scripts/memory_distill_experiment.sh score     # 4. both probe sets, start and every arm
#   bash scripts/memory_distill_experiment.sh evals     # 5. tip-free success, probe variations
#   bash scripts/memory_distill_experiment.sh report    # 6. the two tables
#   bash scripts/memory_distill_experiment.sh archive   # 7. the small records into $ARCHIVE
#
# 1. prep: scripts/probe_experiment.sh sft and memory with the same ROOT: the format-only SFT
#    start (its hashes recorded in $ARCHIVE/sft.json when first built, and checked against them
#    on a rebuild; docs/memory_distill.md says why not docs/probe's) and the rule-reflector
#    memory over the first TRAIN_ROWS train variations (lr 0, 4 iterations). The dev probe set
#    is the committed docs/probe/probe/probe.jsonl (40 dev variations, built by that script's
#    `probe` step from the earlier start), copied in: every arm is scored on the same texts.
# 2. insample: the start WITH that memory on the TRAIN_ROWS update variations themselves
#    (launch/eval.py --split=train), INSAMPLE_REPEATS episodes each at temperature 0.4, before
#    any update; every turn of every episode that showed a tip becomes a sample of the in-sample
#    set (launch/probe.py --make), split by success, at most PROBE_MAX_EPISODES failed episodes.
# 3. arms, from the start with the memory of step 1 (memory.init_from), rule reflector, on the
#    TRAIN_ROWS update variations, ITERS iterations of the base config's 2 rows x 4 rollouts:
#      A  empo2, force_mode=off: every iteration rolls out with tips and updates off-policy
#         (paper-era: tip-free old log-prob, the low-probability mask at -5)
#      D  empo2, force_mode=on: on-policy without tips (any update, no distillation)
#      E  empo2_release, force_mode=off: the authors' shipped configuration (release ratio, no
#         mask, rollout-level advantage, prompt_len_check=sampled, methods/empo2_release.py)
#      F  ctx_distill, force_mode=off: every iteration samples tip-free with shadow retrieval
#         and adds the reverse KL to the model given the step's tips (loss.ctx_kl_coef=1)
#      G  opid, force_mode=off: tip-free sampling, the episode's own rule tip as hindsight, its
#         log-prob gain as a token advantage (loss.opid_coef=1)
#    F and G keep the paper-era low-probability mask, as D does: F - D and G - D isolate the
#    distillation term. Each run keeps its last checkpoint; `export` writes its HF weights.
# 4. score: launch/probe.py on the start and on every arm's last checkpoint, dev set into
#    $ROOT/scores, in-sample set into $ROOT/scores_insample.
# 5. evals: every arm's last checkpoint WITHOUT memory on the first PROBE_ROWS dev variations,
#    one episode each, temperature 0.4 (and the start).
# 6. report: scripts/probe_report.py for each set: per arm the change from the start, mean ± s.e.
#    over seeds, paired differences against D and A with 95% t-intervals over seeds, ratio
#    quantiles, the share of A > 0 tokens with r < 1 - eps_low, the teacher KL.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
ROOT=${ROOT:-runs/memory_distill}
BASE=${BASE:-configs/sciworld.py:learn,format}
TASK=${TASK:-find-non-living-thing}
TRAIN_ROWS=${TRAIN_ROWS:-4}
PROBE_ROWS=${PROBE_ROWS:-40}
INSAMPLE_REPEATS=${INSAMPLE_REPEATS:-8}
PROBE_MAX_EPISODES=${PROBE_MAX_EPISODES:-20}
SEEDS=${SEEDS:-0 1 2}
ITERS=${ITERS:-5}
ARMS=${ARMS:-D F A E G}
ARCHIVE=${ARCHIVE:-docs/memory_distill}
HF=$(realpath -m "$ROOT/sft/sft/hf")
MEM=$ROOT/memory
CFG="$BASE,task=$TASK"

run() { echo "+ $*"; "$@"; }

arm_flags() {
  case "$1" in
    A) echo "--config.method=empo2 --config.empo2.force_mode=off" ;;
    D) echo "--config.method=empo2 --config.empo2.force_mode=on" ;;
    E) echo "--config.method=empo2_release --config.empo2.force_mode=off" ;;
    F) echo "--config.method=ctx_distill --config.empo2.force_mode=off" ;;
    G) echo "--config.method=opid --config.empo2.force_mode=off" ;;
    *) echo "unknown arm $1 (valid: A D E F G)" >&2; return 1 ;;
  esac
}

done_iters() {
  { ls "$1/checkpoints" 2> /dev/null | grep -E '^[0-9]+$' || true; } | sort -n | tail -1 | grep . || echo 0
}

common() {  # the flags every run and evaluation shares (the method comes from arm_flags)
  echo "--config=$CFG --config.empo2.reflector=rule" \
    "--config.model.checkpoint=$HF --config.env.num_train_variations=$TRAIN_ROWS"
}

step_prep() {
  mkdir -p "$ROOT/probe"
  [ -f "$ROOT/probe/probe.jsonl" ] || cp docs/probe/probe/probe.jsonl "$ROOT/probe/probe.jsonl"
  for s in sft memory; do
    run env ROOT="$ROOT" PY="$PY" BASE="$BASE" TASK="$TASK" TRAIN_ROWS="$TRAIN_ROWS" \
      ARCHIVE="$ARCHIVE" bash scripts/probe_experiment.sh "$s"
  done
}

step_insample() {
  local eps=$ROOT/insample/episodes
  if [ ! -f "$eps/with.jsonl" ]; then
    # shellcheck disable=SC2046
    run "$PY" launch/eval.py $(common) --config.method=empo2 --split=train --memory=with \
      --label=insample_episodes --config.env.num_test_variations="$TRAIN_ROWS" \
      --config.train.eval_repeats="$INSAMPLE_REPEATS" --config.train.eval_temperature=0.4 \
      --workdir="$MEM" --out="$ROOT/insample" --episodes="$eps"
  fi
  [ -f "$ROOT/insample/probe.jsonl" ] && { echo "in-sample set done"; return; }
  run "$PY" launch/probe.py --make --episodes="$eps/with.jsonl" \
    --max_failed_episodes="$PROBE_MAX_EPISODES" --probe="$ROOT/insample/probe.jsonl"
}

step_arms() {
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local dir=$ROOT/arms/${arm}_s$seed
      [ "$(done_iters "$dir")" -ge "$ITERS" ] && continue
      # shellcheck disable=SC2046
      run "$PY" launch/train.py $(common) $(arm_flags "$arm") --config.seed="$seed" \
        --config.memory.init_from="$(realpath -m "$MEM")" --config.train.iterations="$ITERS" \
        --config.train.eval_every=0 --config.train.eval_at_end=False \
        --config.train.checkpoint_every=1 --config.train.keep_checkpoints=1 \
        --config.train.save_episodes=True --workdir="$dir"
    done
  done
}

score_one() {  # score_one WORKDIR SET OUT
  [ -f "$3" ] && return
  run "$PY" launch/probe.py --workdir="$1" --probe="$2" --out="$3"
}

step_score() {
  mkdir -p "$ROOT/scores" "$ROOT/scores_insample"
  local dev=$ROOT/probe/probe.jsonl ins=$ROOT/insample/probe.jsonl
  score_one "$ROOT/sft" "$dev" "$ROOT/scores/start.json"
  score_one "$ROOT/sft" "$ins" "$ROOT/scores_insample/start.json"
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local dir=$ROOT/arms/${arm}_s$seed
      [ "$(done_iters "$dir")" -ge "$ITERS" ] || continue
      score_one "$dir" "$dev" "$ROOT/scores/${arm}_s$seed.json"
      score_one "$dir" "$ins" "$ROOT/scores_insample/${arm}_s$seed.json"
    done
  done
}

eval_one() {  # eval_one WORKDIR DEST [extra flags]: tip-free on the probe variations
  local dir=$1 dest=$2
  shift 2
  [ -f "$dest/eval/result.json" ] && return
  # shellcheck disable=SC2046
  run "$PY" launch/eval.py $(common) --split=dev --memory=without \
    --config.env.num_test_variations="$PROBE_ROWS" --config.train.eval_repeats=1 \
    --config.train.eval_temperature=0.4 --workdir="$dir" --out="$dest" "$@"
}

step_evals() {
  eval_one "$ROOT/evals/start" "$ROOT/evals/start" --method=naive --label=start
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local dir=$ROOT/arms/${arm}_s$seed
      [ "$(done_iters "$dir")" -ge "$ITERS" ] && eval_one "$dir" "$ROOT/evals/${arm}_s$seed" \
        --label="$arm"
    done
  done
}

step_export() {  # each finished arm's last params as an HF directory (rescoring needs only this)
  for seed in $SEEDS; do
    for arm in $ARMS; do
      local dir=$ROOT/arms/${arm}_s$seed
      [ "$(done_iters "$dir")" -ge "$ITERS" ] || continue
      [ -f "$dir/hf/config.json" ] || run "$PY" launch/export.py --workdir="$dir" --out="$dir/hf"
    done
  done
}

step_report() {
  for set in scores scores_insample; do
    echo "## $set"
    run "$PY" scripts/probe_report.py "$ROOT" --arms="$ARMS" --seeds="$SEEDS" --scores="$set"
  done
}

step_archive() { run "$PY" scripts/probe_report.py "$ROOT" --archive="$ARCHIVE"; }

case "${1:-}" in
  prep) step_prep ;;
  insample) step_insample ;;
  arms) step_arms ;;
  score) step_score ;;
  evals) step_evals ;;
  export) step_export ;;
  report) step_report ;;
  archive) step_archive ;;
  all) step_prep; step_insample; step_arms; step_score; step_evals; step_export; step_report ;;
  *)
    echo "usage: $0 prep|insample|arms|score|evals|export|report|archive|all (env: PY ROOT" \
      "BASE TASK TRAIN_ROWS PROBE_ROWS INSAMPLE_REPEATS PROBE_MAX_EPISODES SEEDS ITERS ARMS" \
      "ARCHIVE)" >&2
    exit 2
    ;;
esac
