#!/usr/bin/env bash
# Runs a file of command lines (e.g. `python configs/sweeps.py table1_cpu > cmds.sh`) one line at
# a time from the repository root, for a small shared machine:
#   - before each line, waits until MemAvailable reaches NEED_MB (train lines: NEED_TRAIN_MB);
#   - while it runs, kills its process group if MemAvailable falls under FLOOR_MB (so the kernel's
#     OOM killer does not pick another job);
#   - a line killed that way (exit 137) is retried up to 4 times; every run resumes from its
#     newest checkpoint, so a retry loses at most one iteration;
#   - a training line that still fails skips the evaluation line right after it.
# Usage: scripts/run_lines.sh CMDS_FILE   (env: NEED_MB=4500 NEED_TRAIN_MB=5500 FLOOR_MB=500)
set -u
file=$(realpath "$1")
cd "$(dirname "$0")/.."
NEED_MB=${NEED_MB:-4500}
NEED_TRAIN_MB=${NEED_TRAIN_MB:-5500}
FLOOR_MB=${FLOOR_MB:-500}
avail() { awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo; }
skip=0
rc=0
while IFS= read -r cmd; do
  [ -z "$cmd" ] && continue
  if [ $skip = 1 ]; then
    echo "=== SKIP (its training failed) $cmd"
    skip=0
    continue
  fi
  need=$NEED_MB
  [[ "$cmd" == *launch/train.py* ]] && need=$NEED_TRAIN_MB
  for attempt in 1 2 3 4; do
    while [ "$(avail)" -lt "$need" ]; do sleep 20; done
    echo "=== $(date +%T) START (attempt $attempt) $cmd"
    t0=$(date +%s)
    setsid nice -n 10 bash -c "$cmd" < /dev/null &
    pid=$!
    while kill -0 $pid 2> /dev/null; do
      if [ "$(avail)" -lt "$FLOOR_MB" ]; then
        echo "=== $(date +%T) WATCHDOG: $(avail) MB available, killing group $pid"
        kill -9 -- -$pid
      fi
      sleep 3
    done
    wait $pid
    rc=$?
    echo "=== $(date +%T) END rc=$rc $(($(date +%s) - t0))s $cmd"
    [ $rc != 137 ] && break
    sleep 60
  done
  [[ $rc != 0 && "$cmd" == *launch/train.py* ]] && skip=1
done < "$file"
echo "=== ALL DONE $(date +%T)"
