#!/usr/bin/env bash
# Recovery from a lost process (fault.policy = restart): the default job (PP=2) in 2
# processes with a snapshot every 10 steps; process 1 is SIGKILLed when step 25 starts.
# From the job's event log (TROUPE_EVENT_LOG, core/events.h) it prints one JSON line:
#   detection_s  the kill -> the survivor declares the process lost
#   exit_s       -> the launcher has reaped every process of the failed start
#   restart_s    -> the new processes have loaded the newest snapshot from disk (reload_s of that)
#   first_step_s -> the first step after the snapshot is done
#   lost_steps   steps trained after the snapshot and trained again
# and, as the reference, cold_start_s: launch -> first step done in an uninterrupted start.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
EV="$OUT/recovery-events.jsonl"
rm -rf "$OUT/recovery-run" "$EV"
TROUPE_EVENT_LOG="$PWD/$EV" TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=25 \
  timeout 900 "$BUILD/troupe" launch --nprocs 2 -- "$BUILD/troupe" train --config configs/sotu.toml \
  --run-dir "$OUT/recovery-run" --set train.steps=30 --set checkpoint.interval=10 --set train.eval_interval=0 \
  --set train.eval_batches=1 --set train.sample_tokens=0 > "$OUT/recovery.log" 2>&1
/usr/bin/python3 - "$EV" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
def first(name, cond=lambda e: True):
    return next(e for e in ev if e["event"] == name and cond(e))
kill = first("injected_fault")
lost = first("lost")
exits = [e for e in ev if e["event"] == "process_exit" and e["restart"] == 0]
relaunch = first("launch", lambda e: e["restart"] == 1)
loaded = [e for e in ev if e["event"] == "snapshot_loaded" and e["restart"] == 1]
step = first("first_step", lambda e: e["resumed"])
launch0 = first("launch", lambda e: e["restart"] == 0)
cold = first("first_step", lambda e: not e["resumed"])
snap_step = loaded[0]["step"]
print(json.dumps({
    "name": "recovery_after_kill",
    "detection_s": lost["t"] - kill["t"],
    "exit_s": max(e["t"] for e in exits) - kill["t"],
    "restart_s": max(e["t"] for e in loaded) - kill["t"],
    "reload_s": max(e["t"] - e["started"] for e in loaded),
    "first_step_s": step["t"] - kill["t"],
    "relaunch_after_exit_s": relaunch["t"] - max(e["t"] for e in exits),
    "lost_steps": kill["step"] - 1 - snap_step,
    "cold_start_s": cold["t"] - launch0["t"],
}))
PYEOF
