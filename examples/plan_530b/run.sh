#!/usr/bin/env bash
# Sizing a job before it runs (docs/plan.md): MT-NLG 530B as it was trained (TP 8 x PP 35 x
# DP 8 on 2240 A100 80GB), the same on GPUs too small for it, and a small job planned on
# this CPU and then run, prediction against measurement.
#   bash examples/plan_530b/run.sh [path/to/troupe]
source "$(dirname "$0")/../lib.sh" "$@"

# 1. MT-NLG 530B: memory per device and stage, the iteration's time split, MFU.
"$TROUPE" plan --config configs/mt-nlg-530b.toml --tokens 270e9
"$TROUPE" plan --config configs/mt-nlg-530b.toml --json > "$WORK/530b.json"
json() { sed -n "s/^  \"$1\": \\([^,]*\\),*\$/\\1/p" "$2"; }
[[ $(json fits "$WORK/530b.json") == true ]] || fail "MT-NLG 530B should fit on A100 80GB"
[[ $(json devices "$WORK/530b.json") == 2240 ]] || fail "MT-NLG 530B ran on 2240 GPUs"
# Smith et al. 2022 report 113-126 TFLOP/s per A100 (36-40% of 312): a model of the same job
# must land in a plausible band around it.
awk -v m="$(json mfu "$WORK/530b.json")" 'BEGIN { exit !(m > 0.25 && m < 0.75) }' ||
  fail "MFU $(json mfu "$WORK/530b.json") is outside 0.25..0.75"

# 2. The same layout on A100 40GB does not fit: refused (exit 2), naming the stage and the fixes.
if "$TROUPE" plan --config configs/mt-nlg-530b.toml --set cluster.gpu=a100-40g 2> "$WORK/40g.err" > /dev/null; then
  fail "530B on A100 40GB was accepted"
fi
cat "$WORK/40g.err"
grep -q "^error: this layout does not fit: stage" "$WORK/40g.err" || fail "the refusal does not name the stage"

# 3. A small job planned on this machine, then trained: prediction vs measured time per step.
"$TROUPE" plan --config configs/tiny.toml --set cluster.gpu=cpu --json > "$WORK/tiny.json"
[[ $(json fits "$WORK/tiny.json") == true ]] || fail "the tiny job should fit"
predicted=$(json iteration_s "$WORK/tiny.json")
"$TROUPE" train "${TINY[@]}" --set train.steps=6 --run-dir "$WORK/tiny"
measured=$(sed -n 's/.*"ms_per_step":\([0-9.e+-]*\).*"step":\([0-9]*\).*/\2 \1/p' "$WORK/tiny/metrics.jsonl" |
           awk '$1 > 1 { s += $2; n++ } END { print s / n / 1000 }')   # step 1 warms up
echo "tiny job: predicted $predicted s per step, measured $measured s"
awk -v p="$predicted" -v m="$measured" 'BEGIN { r = m / p; exit !(r > 0.1 && r < 10) }' ||
  fail "the prediction is off by more than 10x"
echo "plan_530b: MT-NLG 530B fits on 2240 A100 80GB and not on 40GB; the tiny job's plan is within 10x of its run"
