#!/usr/bin/env bash
# A job over 4 processes loses one mid-run and finishes by itself, with the losses of a run
# that was never interrupted (docs/multiprocess.md "fault tolerance").
#   bash examples/kill_and_recover/run.sh [path/to/troupe]
source "$(dirname "$0")/../lib.sh" "$@"
JOB=("${TINY[@]}" --set parallel.pp=2 --set parallel.dp=2 --set train.steps=6 --set checkpoint.interval=2
     --set fault.timeout_s=10 --set train.timeout_s=60)

# 1. The reference: the same job in one process, never interrupted.
"$TROUPE" train "${JOB[@]}" --run-dir "$WORK/straight"

# 2. The job over 4 processes (pp=2 x dp=2, one worker each). A fault switch makes process 3
#    SIGKILL itself when step 5 starts (TROUPE_FAULT_*: first start only). troupe launch
#    starts it again; the three survivors notice the loss, wait for it and all continue from
#    the newest complete snapshot on disk (step 4, or step 2 if step 4's was still being written).
TROUPE_FAULT_KILL_RANK=3 TROUPE_FAULT_KILL_STEP=5 \
  "$TROUPE" launch --nprocs 4 --grace 15 -- "$TROUPE" train "${JOB[@]}" --set train.threads=1 --run-dir "$WORK/killed" \
  2> "$WORK/killed.log" || { cat "$WORK/killed.log" >&2; fail "the job did not finish"; }
grep -E "killed by signal|recovery:|done:" "$WORK/killed.log"
grep -q "recovering in place" "$WORK/killed.log" || fail "the job did not recover in place"

# 3. The job finished on its own with the uninterrupted run's losses, bit for bit.
losses "$WORK/straight" > "$WORK/straight.losses"
losses "$WORK/killed" > "$WORK/killed.losses"
paste "$WORK/straight.losses" "$WORK/killed.losses"
[[ $(wc -l < "$WORK/killed.losses") == 6 ]] || fail "expected 6 step losses"
cmp "$WORK/straight.losses" "$WORK/killed.losses" || fail "the recovered run's losses differ"

# 4. The run's picture marks the recovery (metrics.jsonl: a resume record with "recovery").
"$TROUPE" plot "$WORK/killed" --out "$WORK/killed.png" | tee "$WORK/plot.txt"
grep -q "recovery at step [0-9]" "$WORK/plot.txt" || fail "plot did not mark the recovery"
from=$(sed -n 's/.*recovery at step \([0-9]*\).*/\1/p' "$WORK/plot.txt")
echo "kill_and_recover: process 3 was killed at step 5; the job recovered from step $from and ended with the same losses"
