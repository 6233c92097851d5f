#!/usr/bin/env bash
# bench/overlap_bench.sh — exposed DP communication per step with the gradient reduce-scatter
# overlapped with the backward pass (parallel.dp_bucket_mb, optimizer/grad_buckets.h) and
# without (dp_bucket_mb = 0): the default model (configs/sotu.toml) with PP=1, DP=2 over 2
# processes (troupe launch --nprocs 2, UCX between them), traced. Off and on alternate for
# ROUNDS rounds (machines shared with other jobs drift); each run trains STEPS steps.
# From each run (steps 3.. STEPS; steps 1-2 warm up, and step 1 has no buckets yet):
#   exposed_comm_ms  median over the steps of the time a step waited for DP communication
#                    ('comm wait' spans of the trace: the reduce-scatter not yet finished when
#                    the backward ended; the all-gather — off: after the update; on: the
#                    forward's waits for the buckets it reaches), DP rank 0. A median, not a
#                    mean: a collective's wait includes the peer process's lateness, and one
#                    slow step of the peer would dominate a mean of 8
#   comm_ms          median over the steps of the communication itself (the reduce-scatter
#                    and all-gather spans on the comm track, bucket spans summed)
#   all_gather_ms    the all-gather part of comm_ms
#   tokens_per_s     tokens of a step / median step time
# Prints one JSON line per mode with the medians over the rounds (and every round's values).
# Needs data/sotu.txt (make data).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-12}
BUCKET_MB=${BUCKET_MB:-4}
PRECISION=${PRECISION:-fp32}  # train.precision (bf16: the parameters all-gathered as 16 bits)
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for mode in off on; do
    mb=0
    [[ $mode == on ]] && mb=$BUCKET_MB
    run="$OUT/overlap-$mode-$r"
    rm -rf "$run"
    timeout 900 "$BUILD/troupe" launch --nprocs 2 -- "$BUILD/troupe" train --config configs/sotu.toml \
      --set parallel.pp=1 --set parallel.dp=2 --set parallel.dp_bucket_mb=$mb --set train.steps="$STEPS" \
      --set train.precision="$PRECISION" \
      --set train.eval_interval=0 --set train.eval_batches=1 --set train.sample_tokens=0 \
      --run-dir "$run" --trace "$run.trace.json" > "$run.log" 2>&1
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def one(run):
    ev = json.load(open(f"{run}.trace.json"))["traceEvents"]
    first = 3
    wait, comm, gather, steps = {}, {}, {}, set()
    for e in ev:
        if e.get("ph") != "X" or e["args"]["step"] < first:
            continue
        k = e["args"]["step"]
        steps.add(k)
        if e["cat"] == "comm wait" and e["tid"] == 0:
            wait[k] = wait.get(k, 0) + e["dur"] / 1e3
        if e["cat"] in ("reduce-scatter", "all-gather") and e["tid"] == 1:
            comm[k] = comm.get(k, 0) + e["dur"] / 1e3
        if e["cat"] == "all-gather" and e["tid"] == 1:
            gather[k] = gather.get(k, 0) + e["dur"] / 1e3
    recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    recs = [j for j in recs if j.get("step", 0) >= first and j.get("ms_per_step")]
    tps = statistics.median(j["tokens_per_s"] for j in recs)
    med = lambda d: statistics.median(d.get(k, 0.0) for k in steps)  # a step without a span: 0
    return med(wait), med(comm), tps, med(gather)
for mode in ("off", "on"):
    runs = [one(f"{out}/overlap-{mode}-{r}") for r in range(1, rounds + 1)]
    print(json.dumps({"name": f"dp_overlap_{mode}",
                      "exposed_comm_ms": statistics.median(x[0] for x in runs),
                      "comm_ms": statistics.median(x[1] for x in runs),
                      "tokens_per_s": statistics.median(x[2] for x in runs),
                      "all_gather_ms": statistics.median(x[3] for x in runs),
                      "rounds": [{"exposed_comm_ms": round(x[0], 2), "comm_ms": round(x[1], 2),
                                  "tokens_per_s": round(x[2], 1)} for x in runs]}))
PYEOF
