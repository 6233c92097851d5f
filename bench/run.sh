#!/usr/bin/env bash
# make bench: troupe against PyTorch and the GEMM libraries, measured in one run.
# Prints a table and writes bench/out/results.json: a list of
#   {"name", "value", "unit", "higher_is_better", "reference", "reference_value", "ratio"}
# with ratio = value / reference_value.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=bench/out
mkdir -p "$OUT"
PY=/usr/bin/python3   # Debian's python3 (python3-torch); not a pyenv one first on PATH
ARGS="--n_layer 4 --n_embd 256 --n_head 4 --seq_len 128 --vocab_size 8192 --batch_size 16"

echo "== GEMM libraries, single thread, model shapes (bench/gemm_bench)"
"$BUILD/gemm_bench" --bt 2048 | tee "$OUT/gemm.txt"
echo "== troupe training step, PP=1, 2 threads (bench/train_bench)"
"$BUILD/train_bench" $ARGS --threads 2 --warmup 3 --iters 10 | tee "$OUT/troupe.jsonl"
echo "== pipeline runtime vs simulator (bench/pipeline_bench)"
"$BUILD/pipeline_bench" 8 | tee "$OUT/pipeline.jsonl"
echo "== troupe plan against Korthikanti et al. 2022 Table 5 (bench/plan_validation; docs/plan.md)"
"$BUILD/plan_validation" | tee "$OUT/plan_validation.md"
echo "== troupe plan --calibrate: six layouts, predicted vs measured tokens/s (bench/plan_bench.sh)"
bash bench/plan_bench.sh | tee "$OUT/plan_bench.jsonl"
echo "== tensor parallelism: in-process all-reduce bus bandwidth, TP=2 vs TP=1 (bench/tp_bench)"
"$BUILD/tp_bench" | tee "$OUT/tp.jsonl"
echo "== bf16 matmul vs fp32, single thread (bench/bf16_bench)"
"$BUILD/bf16_bench" | tee "$OUT/bf16.txt"
echo "== mixed precision: default job tokens/s in fp32, bf16, fp16 (bench/precision_bench)"
"$BUILD/precision_bench" | tee "$OUT/precision.jsonl"
echo "== mixed precision: the default job for 200 steps in fp32 and bf16 (loss curves; needs make data)"
for p in fp32 bf16; do
  rm -rf "$OUT/run-$p"
  "$BUILD/troupe" train --config configs/sotu.toml --run-dir "$OUT/run-$p" --set train.steps=200 \
    --set train.eval_interval=0 --set train.eval_batches=1 --set train.sample_tokens=0 --set train.precision=$p \
    2>&1 | grep -E "step +(1|50|100|150|200)/200" || true
done
echo "== snapshots: training stall async vs synchronous, writer throughput vs dd (bench/checkpoint_bench)"
"$BUILD/checkpoint_bench" --dir "$OUT/ckpt" | tee "$OUT/checkpoint.jsonl"
dd if=/dev/zero of="$OUT/dd.bin" bs=1M count=256 conv=fsync 2>&1 | tail -1 | tee "$OUT/dd.txt"
rm -f "$OUT/dd.bin"
echo "== export: a bf16-trained snapshot as safetensors, its logits checked by PyTorch (bench/reference/check_export.py)"
rm -rf "$OUT/export-run"
"$BUILD/troupe" train --config configs/tiny.toml --run-dir "$OUT/export-run" --set train.steps=50 \
  --set checkpoint.interval=50 --set train.sample_tokens=0 --set train.precision=bf16 > /dev/null 2>&1
SNAP="$OUT/export-run/checkpoints/step-00000050"
"$BUILD/troupe" export "$SNAP" --format safetensors "$OUT/model.safetensors"
"$BUILD/troupe" generate "$SNAP" --prompt "The Congress" --tokens 16 --logits-out "$OUT/logits.json"
"$PY" bench/reference/check_export.py "$OUT/model.safetensors" "$OUT/logits.json" | tee "$OUT/export.json"
echo "== PyTorch reference, 2 threads, OpenBLAS presets unset (bench/reference/torch_bench.py)"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
  "$PY" bench/reference/torch_bench.py $ARGS --threads 2 --warmup 3 --iters 10 | tail -1 | tee "$OUT/torch.json"
echo "== UCX data plane between 2 and 4 processes (bench/ucx_bench) vs ucx_perftest on 127.0.0.1"
# Both inherit UCX_TLS (unset: UCX's own choice). ucx_perftest runs with -e (endpoints with
# peer error handling, as troupe creates them; UCX 1.13's shared-memory transports lack it,
# so both end up on the same transports: tcp, cma).
"$BUILD/ucx_bench" | tee "$OUT/ucx.jsonl"
perftest() {  # PORT ARGS...: one ucx_perftest server + client; prints the client's "Final:" line
  local port=$1; shift
  timeout 300 ucx_perftest -p "$port" -e > /dev/null 2>&1 &
  local srv=$! line="" try
  for try in 1 2 3 4 5 6 7 8 9 10; do  # until the server listens
    sleep 0.5
    line=$(timeout 300 ucx_perftest 127.0.0.1 -p "$port" -e "$@" 2>/dev/null | grep "^Final:") && break
  done
  wait "$srv" || true
  [[ -n "$line" ]] || { echo "ucx_perftest $* failed" >&2; return 1; }
  echo "$line"
}
perftest 13371 -t tag_bw -s 67108864 -n 32 | tee "$OUT/ucx_perftest_bw.txt"
perftest 13372 -t tag_lat -s 8 -n 10000 | tee "$OUT/ucx_perftest_lat.txt"
echo "== recovery from a killed process (fault.policy = restart): whole job vs in place, disk vs peer memory (bench/recovery_bench.sh)"
BUILD="$BUILD" OUT="$OUT" bash bench/recovery_bench.sh | tee "$OUT/recovery.json"
echo "== the default job (PP=2) in 2 processes (troupe launch) vs the same layout in one process, 40 steps"
for n in 1 2; do
  rm -rf "$OUT/mp-run-$n"
  JOB=("$BUILD/troupe" train --config configs/sotu.toml --run-dir "$OUT/mp-run-$n" --set train.steps=40
       --set train.eval_interval=0 --set train.eval_batches=1 --set train.sample_tokens=0)
  if [[ $n == 1 ]]; then "${JOB[@]}" > /dev/null 2>&1; else "$BUILD/troupe" launch --nprocs 2 -- "${JOB[@]}" > /dev/null 2>&1; fi
  tail -1 "$OUT/mp-run-$n/metrics.jsonl" | tee "$OUT/mp-$n.json"
done
echo "== DP=2 over 2 processes: exposed DP communication per step, reduce-scatter overlapped with backward or not (bench/overlap_bench.sh)"
BUILD="$BUILD" OUT="$OUT" bash bench/overlap_bench.sh | tee "$OUT/overlap.jsonl"
echo "== data: troupe prepare on ~1 GiB vs spm_encode on the same text, 2 cores (bench/data_bench.sh)"
BUILD="$BUILD" OUT="$OUT" bash bench/data_bench.sh | tee "$OUT/data.jsonl"

"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
tr = {}
for line in open(f"{out}/troupe.jsonl"):
    j = json.loads(line); tr[j["name"]] = j
gl = [json.loads(l) for l in open(f"{out}/gemm.txt") if l.startswith("{")][0]
th = json.loads(open(f"{out}/torch.json").read())
step = tr["train_step"]
flops_tok = step["flops_per_token"]; peak = step["peak_gflops"] * 1e9
ref_name = "pytorch-%s-cpu" % th["torch"].split("a0")[0].rsplit(".", 1)[0]
res = []
def add(name, value, unit, hib, ref, refv):
    res.append({"name": name, "value": value, "unit": unit, "higher_is_better": hib,
                "reference": ref, "reference_value": refv, "ratio": value / refv})
add("train_step_tokens_per_s", step["tokens_per_s"], "tokens/s", True, ref_name, th["tokens_per_s"])
add("train_step_ms", step["ms_per_step"], "ms", False, ref_name, th["ms_per_step"])
add("train_step_mfu", step["mfu"], "fraction of measured peak", True, ref_name, th["tokens_per_s"] * flops_tok / peak)
g = tr["gemm_all"]
add("gemm_gflops_model_shapes_2_threads", g["troupe_gflops"], "GFLOP/s", True, "onednn-2.6-sgemm-2-threads", g["library_gflops"])
best = max((v, k) for k, v in gl.items() if k != "name")
add("gemm_library_best_single_thread", best[0], "GFLOP/s", True, "openblas-0.3.21-haswell-single-thread", gl["openblas"])
for line in open(f"{out}/pipeline.jsonl"):
    j = json.loads(line)
    if j["name"] == "pipeline_overhead_default_job":
        add("pipeline_step_ms_default_job", j["measured_ms"], "ms", False, "simulator-fed-measured-action-costs", j["simulated_ms"])
    else:
        add(j["name"] + "_measured", j["measured_bubble"], "bubble fraction", False, "theoretical-unit-costs", j["theoretical_bubble"])
tp = {}
for line in open(f"{out}/tp.jsonl"):
    j = json.loads(line)
    if j["name"] == "allreduce_busbw":
        kib = j["bytes"] // 1024
        label = f"{kib // 1024}MiB" if kib >= 1024 else f"{kib}KiB"
        add(f"allreduce_busbw_{label}_2ranks", j["busbw_gbs"], "GB/s", True, "memcpy-1-thread", j["memcpy_gbs"])
    else:
        tp[j["name"]] = j
for dp in (2, 4):
    add(f"zero1_optimizer_bytes_per_rank_dp{dp}", tp[f"zero1_optimizer_bytes_dp{dp}"]["bytes_per_rank"], "bytes", False,
        "troupe-dp1", tp["zero1_optimizer_bytes_dp1"]["bytes_per_rank"])
add("default_model_tp2_tokens_per_s", tp["default_model_tp2"]["tokens_per_s"], "tokens/s", True, "troupe-tp1",
    tp["default_model_tp1"]["tokens_per_s"])
bf = [json.loads(l) for l in open(f"{out}/bf16.txt") if l.startswith("{")][0]
add("bf16_matmul_gflops_single_thread", bf["bf16_gflops"], "GFLOP/s", True, "onednn-2.6-fp32-matmul-single-thread", bf["fp32_gflops"])
pr = {}
for line in open(f"{out}/precision.jsonl"):
    j = json.loads(line); pr[j["name"]] = j
add("default_job_bf16_tokens_per_s", pr["precision_bf16"]["tokens_per_s"], "tokens/s", True, "troupe-fp32", pr["precision_fp32"]["tokens_per_s"])
add("default_job_fp16_tokens_per_s", pr["precision_fp16"]["tokens_per_s"], "tokens/s", True, "troupe-fp32", pr["precision_fp32"]["tokens_per_s"])
def tail_loss(p):
    ls = [json.loads(l) for l in open(f"{out}/run-{p}/metrics.jsonl")]
    ls = [j["loss"] for j in ls if "loss" in j and "step" in j and j["step"] > 180]
    return sum(ls) / len(ls)
add("default_job_bf16_loss_steps_181_200", tail_loss("bf16"), "nats", False, "troupe-fp32", tail_loss("fp32"))
ck = {}
for line in open(f"{out}/checkpoint.jsonl"):
    j = json.loads(line); ck[j["name"]] = j
add("snapshot_training_stall_ms", ck["snapshot_async"]["stall_ms"], "ms", False, "synchronous-write-same-snapshot", ck["snapshot_sync"]["stall_ms"])
import re
dd = open(f"{out}/dd.txt").read()
m = re.search(r"([\d.]+) s, ([\d.]+) ([MG])B/s", dd)
dd_mb = float(m.group(2)) * (1000 if m.group(3) == "G" else 1)
add("snapshot_write_mb_s", ck["snapshot_sync"]["write_mb_s"], "MB/s", True, "dd-bs1M-conv-fsync", dd_mb)
ex = json.loads(open(f"{out}/export.json").read())
add("export_logits_max_abs_diff_vs_pytorch", ex["max_abs_diff"], "logit", False, "tolerance-1e-4*(1+max|logit|)",
    1e-4 * (1 + ex["max_abs_logit"]))
# ucx_perftest's "Final:" columns: iterations, latency 50%ile / average / overall (usec),
# bandwidth average / overall (MB/s = 2^20 bytes/s), message rate average / overall
pt_bw = float(open(f"{out}/ucx_perftest_bw.txt").read().split()[6])
pt_lat = float(open(f"{out}/ucx_perftest_lat.txt").read().split()[3])
pt_lat_median = float(open(f"{out}/ucx_perftest_lat.txt").read().split()[2])
ux = [json.loads(l) for l in open(f"{out}/ucx.jsonl") if l.startswith("{")]
for j in ux:
    if j["name"] == "ucx_p2p_bw" and j["bytes"] == 64 << 20:
        add("ucx_p2p_bw_64MiB", j["mib_s"], "MiB/s", True, "ucx_perftest-1.13-tag_bw-e", pt_bw)
    elif j["name"] == "ucx_p2p_latency":
        add("ucx_p2p_latency_8B", j["usec"], "us", False, "ucx_perftest-1.13-tag_lat-e-busy-poll", pt_lat)
        # medians: less moved by other jobs on the machine than the means (docs/multiprocess.md)
        add("ucx_p2p_latency_8B_median", j["usec_median"], "us", False, "ucx_perftest-1.13-tag_lat-e-busy-poll-50%ile",
            pt_lat_median)
    elif j["name"] == "ucx_allreduce_busbw" and j["bytes"] == 64 << 20:
        add(f"ucx_allreduce_busbw_64MiB_{j['processes']}procs", j["busbw_gbs"], "GB/s", True,
            "ucx_perftest-1.13-tag_bw-e-64MiB", pt_bw * 2**20 / 1e9)
mp1 = json.loads(open(f"{out}/mp-1.json").read())
mp2 = json.loads(open(f"{out}/mp-2.json").read())
add("default_job_pp2_2processes_tokens_per_s", mp2["tokens_per_s"], "tokens/s", True, "troupe-pp2-1-process",
    mp1["tokens_per_s"])
rec = {}
for line in open(f"{out}/recovery.json"):
    j = json.loads(line)
    rec[j.get("mode", j["name"])] = j
for mode in ("job", "process-disk", "process-memory"):
    rc = rec[mode]
    add(f"recovery_{mode}_kill_to_first_step_s", rc["first_step_s"], "s", False, "cold-start-launch-to-first-step",
        rc["cold_start_s"])
add("recovery_detection_s", rec["process-memory"]["detection_s"], "s", False, "fault.timeout_s-default", 30.0)
add("recovery_state_from_peer_memory_s", rec["process-memory"]["reload_s"], "s", False, "state-from-disk-in-place",
    rec["process-disk"]["reload_s"])
add("recovery_in_place_kill_to_first_step_s", rec["process-memory"]["first_step_s"], "s", False,
    "whole-job-restart-from-disk", rec["job"]["first_step_s"])
mo = rec["memory_snapshot_overhead"]
add("tokens_per_s_memory_snapshot_every_step", mo["tokens_per_s_memory_every_step"], "tokens/s", True,
    "no-memory-snapshots", mo["tokens_per_s_none"])
ov = {}
for line in open(f"{out}/overlap.jsonl"):
    j = json.loads(line); ov[j["name"]] = j
off, on = ov["dp_overlap_off"], ov["dp_overlap_on"]
add("dp_overlap_off", off["exposed_comm_ms"], "ms exposed comm/step", False, "dp_overlap_off", off["exposed_comm_ms"])
add("dp_overlap_on", on["exposed_comm_ms"], "ms exposed comm/step", False, "dp_overlap_off", off["exposed_comm_ms"])
for r, j in zip(res[-2:], (off, on)):  # the issue's fields beside the common ones
    r["exposed_comm_ms"] = j["exposed_comm_ms"]
    r["tokens_per_s"] = j["tokens_per_s"]
    r["comm_ms"] = j["comm_ms"]
da = {}
for line in open(f"{out}/data.jsonl"):
    j = json.loads(line); da[j["name"]] = j
add("prepare_1GiB_mb_s", da["prepare"]["mb_s"], "MB/s", True, "spm_encode-0.1.97-2-processes", da["spm_encode"]["mb_s"])
add("prepare_1GiB_peak_rss_mb", da["prepare"]["peak_rss_mb"], "MB", False, "limit-2GiB", 2048.0)
json.dump(res, open(f"{out}/results.json", "w"), indent=2)
print()
print(f"{'benchmark':40} {'value':>10} {'unit':>16}   {'reference':38} {'ref value':>10} {'ratio':>7}")
for r in res:
    print(f"{r['name']:40} {r['value']:10.4g} {r['unit']:>16}   {r['reference']:38} {r['reference_value']:10.4g} {r['ratio']:7.3f}")
print(f"\nbest single-thread library: {best[1]} ({best[0]:.0f} GFLOP/s); wrote {out}/results.json")
PYEOF
