#!/usr/bin/env bash
# A pipeline schedule is data (README "Pipeline schedules"): dump a built-in one, edit it
# by hand, let the validator and the simulator look at it, then train with it.
#   bash examples/custom_schedule/run.sh [path/to/troupe]
source "$(dirname "$0")/../lib.sh" "$@"

# 1. Dump 1F1B for 2 stages and 4 microbatches: one row per stage, one action per cell.
"$TROUPE" simulate --schedule 1f1b --stages 2 --microbatches 4 --dump "$WORK/1f1b.txt"
cat "$WORK/1f1b.txt"

# 2. A hand-made variant: stage 0 runs one more forward before its first backward (three
#    microbatches in flight instead of two). The backward passes keep their order, so the
#    gradients accumulate in the same order and training gives bitwise 1F1B's losses.
cat > "$WORK/eager.txt" <<'SCHEDULE'
# 1F1B with one more warm-up forward on stage 0
F0,F1,F2,B0,F3,B1,B2,B3
F0,B0,F1,B1,F2,B2,F3,B3
SCHEDULE

# 3. The validator refuses a broken edit (a backward before its forward), naming it, exit 2.
printf 'F0,F1,F2,B0,F3,B1,B2,B3\nB0,F0,F1,B1,F2,B2,F3,B3\n' > "$WORK/broken.txt"
if "$TROUPE" simulate --schedule "$WORK/broken.txt" 2> "$WORK/broken.err"; then fail "the broken schedule was accepted"; fi
cat "$WORK/broken.err"
grep -q "^error: .*stage 1" "$WORK/broken.err" || fail "the validator did not name stage 1"

# 4. Simulate it: bubble, peak microbatches in flight per stage, ASCII timeline.
"$TROUPE" simulate --schedule "$WORK/eager.txt" | tee "$WORK/sim.txt"
inflight=$(awk '$1 == "0" && NF == 5 { print $4 }' "$WORK/sim.txt")
[[ "$inflight" == 3 ]] || fail "stage 0 should hold 3 microbatches in flight, the simulator says '$inflight'"

# 5. Train the tiny model 3 steps with it, and with the built-in 1F1B: the same losses, bit for bit.
"$TROUPE" train "${TINY[@]}" --set train.steps=3 --set "parallel.schedule=$WORK/eager.txt" --run-dir "$WORK/eager"
"$TROUPE" train "${TINY[@]}" --set train.steps=3 --set parallel.schedule=1f1b --run-dir "$WORK/builtin"
losses "$WORK/eager" > "$WORK/eager.losses"
losses "$WORK/builtin" > "$WORK/builtin.losses"
cat "$WORK/eager.losses"
[[ $(wc -l < "$WORK/eager.losses") == 3 ]] || fail "expected 3 step losses"
cmp "$WORK/eager.losses" "$WORK/builtin.losses" || fail "the hand-made schedule changed the losses"
echo "custom_schedule: the hand-made schedule validates, holds 3 microbatches on stage 0, and trains to 1F1B's losses"
