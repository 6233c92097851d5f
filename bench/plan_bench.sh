#!/usr/bin/env bash
# troupe plan on this machine: one traced run fits the per-action costs (--calibrate);
# then six layouts of the same model (PP in {1,2,4}, TP in {1,2}, DP in {1,2}) are
# trained and their measured tokens/s compared with the plan's. Prints one JSON line per
# layout: {"layout", "measured_tokens_per_s", "predicted_tokens_per_s", "error", "load",
# "others_cores"}: load is the 1-minute load average when the layout started (lagging);
# others_cores the cores that other processes (and the hypervisor, as steal) kept busy
# while it trained, from /proc/stat less the run's own CPU time: 0 on a quiet machine.
# The model: the default shape (8 layers, n_embd 256, 4 heads, 128 tokens, batch 16) on
# the tiny corpus (vocabulary 512: the corpus is too small for 8192). Timing is noisy on a
# shared machine: read the error with the load (uptime) printed at the start.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out/plan}
STEPS=${STEPS:-20}
mkdir -p "$OUT"
CFG=configs/tiny.toml
MODEL="--set model.n_layer=8 --set model.n_embd=256 --set model.n_head=4 --set model.block_size=128 \
  --set train.seq_len=128 --set train.batch_size=16 --set parallel.microbatches=4 --set data.cache_dir=$OUT/cache"
COMMON="--set train.eval_interval=0 --set train.eval_batches=1 --set train.sample_tokens=0 --set train.threads=${THREADS:-2}"
busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }  # jiffies, all cores
# train ARGS...: runs troupe train; sets others (cores used by everyone else meanwhile)
train() {
  local b0 b1 t
  b0=$(busy)
  /usr/bin/time -f "%e %U %S" -o "$OUT/time.txt" "$BUILD/troupe" train "$@"
  b1=$(busy)
  t=$(cat "$OUT/time.txt")
  others=$(awk -v b0="$b0" -v b1="$b1" -v t="$t" -v hz="$(getconf CLK_TCK)" \
    'BEGIN{split(t, a, " "); printf "%.2f", ((b1 - b0) / hz - a[2] - a[3]) / a[1]}')
}
uptime
rm -rf "$OUT/cal" && mkdir -p "$OUT/cal"
train --config $CFG $MODEL $COMMON --set train.steps=$STEPS --run-dir "$OUT/cal" \
  --trace "$OUT/cal/trace.json" > "$OUT/cal.log" 2>&1
echo "calibration run: other processes kept $others cores busy"
"$BUILD/troupe" plan --config $CFG $MODEL $COMMON --set cluster.gpu=cpu --calibrate "$OUT/cal" | head -2
for layout in "1 1 1" "2 1 1" "4 1 1" "1 2 1" "2 2 1" "2 1 2"; do
  read -r pp tp dp <<< "$layout"
  load=$(cut -d' ' -f1 /proc/loadavg)
  L="--set parallel.pp=$pp --set parallel.tp=$tp --set parallel.dp=$dp"
  run="$OUT/run-pp$pp-tp$tp-dp$dp"
  rm -rf "$run"
  train --config $CFG $MODEL $COMMON $L --set train.steps=$STEPS --run-dir "$run" > "$run.log" 2>&1
  pred=$("$BUILD/troupe" plan --config $CFG $MODEL $COMMON $L --set cluster.gpu=cpu --calibrate "$OUT/cal" --json)
  /usr/bin/python3 - "$run/metrics.jsonl" "$pp" "$tp" "$dp" "$pred" "$load" "$others" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["tokens_per_s"] for r in rows if "loss" in r and r.get("step", 0) > 2]
measured = statistics.median(steps)
predicted = json.loads(sys.argv[5])["tokens_per_s"]
print(json.dumps({"layout": f"pp{sys.argv[2]} tp{sys.argv[3]} dp{sys.argv[4]}", "measured_tokens_per_s": round(measured),
                  "predicted_tokens_per_s": round(predicted), "error": round(predicted / measured - 1, 3),
                  "load": float(sys.argv[6]), "others_cores": float(sys.argv[7])}))
PY
done
