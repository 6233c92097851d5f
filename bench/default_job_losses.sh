#!/usr/bin/env bash
# bench/default_job_losses.sh OUT_DIR — the default job (configs/sotu.toml) for 50 steps in
# fp32, bf16, fp16 and PP2xTP2xDP2 with build/troupe; writes OUT_DIR/<name>.losses (one
# "step loss val_loss grad_norm" line per record, at the full printed precision of
# metrics.jsonl) and OUT_DIR/<name>.actbuf (the log's "activation buffers" lines).
# Two builds give bitwise the same training when `diff -r A/*.losses B/*.losses` is empty
# (built on the same machine). Needs data/sotu.txt (`make data`). About 6 minutes on 2 cores.
set -euo pipefail
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
COMMON=(--set train.steps=50 --set train.eval_interval=25 --set train.sample_tokens=0)
run() {
  local name=$1
  shift
  rm -rf "$OUT/run-$name"
  build/troupe train --config configs/sotu.toml "${COMMON[@]}" "$@" --run-dir "$OUT/run-$name" > "$OUT/$name.log" 2>&1
  python3 - "$OUT/run-$name/metrics.jsonl" > "$OUT/$name.losses" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r or "val_loss" in r:
        print(r.get("step"), repr(r.get("loss")), repr(r.get("val_loss")), repr(r.get("grad_norm")))
PY
  grep -h "activation buffers" "$OUT/$name.log" | sed 's/^\[[^]]*\] //' > "$OUT/$name.actbuf" || true
}
run fp32
run bf16 --set train.precision=bf16
run fp16 --set train.precision=fp16
run pp2tp2dp2 --set parallel.pp=2 --set parallel.tp=2 --set parallel.dp=2
echo "wrote $OUT"
