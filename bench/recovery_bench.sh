#!/usr/bin/env bash
# Recovery from a lost process (fault.policy = restart), three ways, on the default job
# (PP=2) in 2 processes with a disk snapshot every 10 steps; process 1 is SIGKILLed when
# step 25 starts:
#   job             troupe launch --respawn job: every process exits and all start again,
#                   each loading the newest disk snapshot (torchrun-style)
#   process-disk    --respawn process (the default): only process 1 starts again, process 0
#                   recovers in place; both continue from the newest disk snapshot
#   process-memory  the same with checkpoint.memory_interval = 1: the state comes from the
#                   memory snapshots (process 1's shards from process 0's copy)
# From each run's event log (TROUPE_EVENT_LOG, core/events.h) it prints one JSON line:
#   detection_s   the kill -> a survivor declares the process lost
#   restart_s     -> every process is running again and has joined (job: has loaded the snapshot)
#   reload_s      the state reload alone (disk read, or the memory shards' exchange), the slowest process
#   state_s       the kill -> every process holds the state it continues from
#   first_step_s  the kill -> the first step after the snapshot is done
#   lost_steps    steps trained after the snapshot and trained again
#   cold_start_s  (reference) launch -> first step done in the uninterrupted start
# and, for the cost of memory snapshots, tokens/s of 30 uninterrupted steps with
# checkpoint.memory_interval = 1 against none (memory_snapshot_overhead).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
COMMON=(--config configs/sotu.toml --set train.steps=30 --set checkpoint.interval=10 --set train.eval_interval=0
        --set train.eval_batches=1 --set train.sample_tokens=0)

run_killed() {  # name, launch options, train options...
  local name=$1 lopt=$2
  shift 2
  local ev="$OUT/recovery-$name-events.jsonl"
  rm -rf "$OUT/recovery-$name-run" "$ev"
  TROUPE_EVENT_LOG="$PWD/$ev" TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=25 \
    timeout 900 "$BUILD/troupe" launch --nprocs 2 $lopt -- "$BUILD/troupe" train "${COMMON[@]}" \
    --run-dir "$OUT/recovery-$name-run" "$@" > "$OUT/recovery-$name.log" 2>&1
  /usr/bin/python3 - "$ev" "$name" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
name = sys.argv[2]
def first(event, cond=lambda e: True):
    return next(e for e in ev if e["event"] == event and cond(e))
def every(event, cond=lambda e: True):
    return [e for e in ev if e["event"] == event and cond(e)]
kill = first("injected_fault")
lost = first("lost")
step = first("first_step", lambda e: e["resumed"])
launch0 = first("launch", lambda e: e["restart"] == 0)
cold = first("first_step", lambda e: not e["resumed"])
if name == "job":
    loaded = every("snapshot_loaded", lambda e: e["restart"] == 1)
    restart_t = max(e["t"] for e in loaded)
    reload_s = max(e["t"] - e["started"] for e in loaded)
    state_t = restart_t
    state_step = loaded[0]["step"]
else:
    joined = every("rejoined")
    restored = every("state_restored")
    restart_t = max(e["t"] for e in joined)
    reload_s = max(e["t"] - e["started"] for e in restored)
    state_t = max(e["t"] for e in restored)
    state_step = restored[0]["step"]
    assert restored[0]["source"] == (2 if name == "process-memory" else 1), restored
print(json.dumps({
    "name": "recovery_after_kill", "mode": name,
    "detection_s": round(lost["t"] - kill["t"], 3),
    "restart_s": round(restart_t - kill["t"], 3),
    "reload_s": round(reload_s, 3),
    "state_s": round(state_t - kill["t"], 3),
    "first_step_s": round(step["t"] - kill["t"], 3),
    "lost_steps": kill["step"] - 1 - state_step,
    "cold_start_s": round(cold["t"] - launch0["t"], 3),
}))
PYEOF
}

run_killed job "--respawn job"
run_killed process-disk ""
run_killed process-memory "" --set checkpoint.memory_interval=1

# the price of a memory snapshot after every step: uninterrupted, tokens/s
tps() {  # name, options...
  local name=$1
  shift
  rm -rf "$OUT/memsnap-$name-run"
  timeout 900 "$BUILD/troupe" launch --nprocs 2 -- "$BUILD/troupe" train "${COMMON[@]}" \
    --run-dir "$OUT/memsnap-$name-run" "$@" > "$OUT/memsnap-$name.log" 2>&1
  /usr/bin/python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if 'summary' in l][-1]['tokens_per_s'])" \
    "$OUT/memsnap-$name-run/metrics.jsonl"
}
base=$(tps none)
mem=$(tps every-step --set checkpoint.memory_interval=1)
/usr/bin/python3 -c "import json,sys; b,m=float(sys.argv[1]),float(sys.argv[2]); print(json.dumps({'name': 'memory_snapshot_overhead', 'tokens_per_s_memory_every_step': round(m), 'tokens_per_s_none': round(b), 'ratio': round(m/b, 3)}))" "$base" "$mem"
