#!/usr/bin/env bash
# Snapshots are layout-free: stop a TP=2 x PP=2 run, resume it as DP=2, export the model to
# safetensors (GPT-2's Hugging Face names) and generate text from the snapshot.
#   bash examples/resume_reshard_export/run.sh [path/to/troupe]
source "$(dirname "$0")/../lib.sh" "$@"
RUN="$WORK/run"

# 1. 3 steps as TP=2 x PP=2 (4 workers), a snapshot at step 3: RUN/checkpoints/step-00000003.
"$TROUPE" train "${TINY[@]}" --set parallel.tp=2 --set parallel.pp=2 --set train.steps=3 --set checkpoint.interval=3 \
  --run-dir "$RUN"

# 2. Resume it as DP=2 (pp=1, tp=1) up to step 6: the logical tensors, AdamW moments
#    included, are reassembled and sharded for the new layout. A snapshot at step 6.
"$TROUPE" train "${TINY[@]}" --set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=2 --set train.steps=6 \
  --set checkpoint.interval=3 --run-dir "$RUN" --resume latest
grep -q '"resumed_from".*"step":3' "$RUN/metrics.jsonl" || fail "metrics.jsonl does not record the resume at step 3"
"$TROUPE" plot "$RUN" --out "$WORK/run.png" | tee "$WORK/plot.txt"   # the curves, the resume marked
grep -q "resume at step 3" "$WORK/plot.txt" || fail "plot did not mark the resume"

# The same 6 steps never stopped (TP=2 x PP=2 throughout): the resharded run follows it to
# rounding (another reduction order), within 1e-4.
"$TROUPE" train "${TINY[@]}" --set parallel.tp=2 --set parallel.pp=2 --set train.steps=6 --run-dir "$WORK/straight"
paste <(losses "$RUN") <(losses "$WORK/straight") | tee "$WORK/both.txt"
awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-4) bad = 1; n++ } END { exit (bad || n != 6) }' \
  "$WORK/both.txt" || fail "the resharded run's losses differ from the uninterrupted run's"

# 3. Export the step-6 snapshot: safetensors starts with an 8-byte header length and a
#    JSON header naming GPT-2's tensors.
SNAP="$RUN/checkpoints/step-00000006"
"$TROUPE" export "$SNAP" --format safetensors "$WORK/model.safetensors"
head -c 200 "$WORK/model.safetensors" | tail -c +9 | grep -q '"h.0.attn.c_attn.weight"\|"wte.weight"' ||
  fail "the export holds no GPT-2 tensor names"

# 4. Generate from the snapshot (greedy: the same text every time).
"$TROUPE" generate "$SNAP" --prompt "The people" --tokens 16 --temperature 0 > "$WORK/a.txt"
"$TROUPE" generate "$SNAP" --prompt "The people" --tokens 16 --temperature 0 > "$WORK/b.txt"
cat "$WORK/a.txt"
[[ $(wc -c < "$WORK/a.txt") -gt 12 ]] || fail "generate printed no continuation"
cmp "$WORK/a.txt" "$WORK/b.txt" || fail "greedy generation is not deterministic"
echo "resume_reshard_export: TP=2 x PP=2 -> DP=2 resume, safetensors export and generation work"
