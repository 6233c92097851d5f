#!/usr/bin/env bash
# Regenerates the pictures of README.md's "See your run" section into docs/figures/:
#   run.png        troupe plot of a tiny run over 2 processes with a recovery (process 1
#                  killed at step 150) and a resume (stopped at 240, resumed to 300)
#   simulate.png   troupe simulate --png: ZB-H1 on 4 stages, 8 microbatches
#   trace.png      train --trace-png: the measured timeline of the tiny job's last step
#   scripts/readme-figures.sh [path/to/troupe]     (about 30 s on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
TROUPE=$(realpath "${1:-build/troupe}")
OUT=docs/figures
WORK=$(mktemp -d /tmp/troupe-figures-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
TINY=(--config configs/tiny.toml --set "data.cache_dir=$WORK/cache" --set train.sample_tokens=0
      --set train.eval_interval=30 --set train.eval_batches=2 --set checkpoint.interval=60 --run-dir "$WORK/run")

"$TROUPE" simulate --schedule zb-h1 --stages 4 --microbatches 8 --quiet --png "$OUT/simulate.png"

TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=150 \
  "$TROUPE" launch --nprocs 2 -- "$TROUPE" train "${TINY[@]}" --set train.steps=240 --set train.threads=1
"$TROUPE" train "${TINY[@]}" --set train.steps=300 --resume latest
"$TROUPE" plot "$WORK/run" --out "$OUT/run.png" \
  --title "configs/tiny.toml over 2 processes: process 1 killed at step 150, stopped at 240 and resumed"

"$TROUPE" train --config configs/tiny.toml --set "data.cache_dir=$WORK/cache" --set train.sample_tokens=0 \
  --set train.steps=4 --set train.eval_interval=0 --set train.eval_batches=1 --run-dir "$WORK/traced" \
  --trace "$WORK/trace.json" --trace-png "$OUT/trace.png"
ls -l "$OUT"
