#!/usr/bin/env bash
# The data path at scale (make bench): `troupe prepare` on a ~1 GiB corpus generated from the
# real sources (bench/make_corpus.py) against SentencePiece's own spm_encode encoding the same
# text with the same tokenizer, on the same 2 cores (two spm_encode processes, one per half).
# prepare does more (hashing, UTF-8 repair, NFC, exact + near dedup, quality filters, training
# the tokenizer on a sample, writing indexed token files); the figure is bytes/s of input.
# Prints JSON lines: prepare {"seconds", "mb_s", "peak_rss_mb", kept/removed counts} and
# spm_encode {"seconds", "mb_s"}. BENCH_DATA_BYTES sets the size (default 1 GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
BYTES=${BENCH_DATA_BYTES:-1073741824}
W="$OUT/data"
mkdir -p "$W"
[[ -f data/brown.txt && -f data/mail.jsonl && -d data/python ]] || bash scripts/get-sources.sh >&2
if [[ ! -f "$W/big.txt" || $(stat -c %s "$W/big.txt") -lt $BYTES ]]; then
  /usr/bin/python3 bench/make_corpus.py "$W/big.txt" --bytes "$BYTES" >&2
fi
cat > "$W/big.toml" <<TOML
[model]
vocab_size = 8192
[data]
cache_dir = "$W/cache"
tokenizer_sample_mb = 64
threads = 2
[[data.sources]]
name = "big"
path = "$W/big.txt"
utf8 = "replace"
TOML
rm -rf "$W/cache"
TROUPE_NO_PROGRESS_BAR=1 /usr/bin/time -v -o "$W/prepare.time" "$BUILD/troupe" prepare --config "$W/big.toml" \
  --report "$W/report.json" > "$W/prepare.out" 2> "$W/prepare.err"
model=$(find "$W/cache" -name tokenizer.model | head -n 1)
split -n l/2 "$W/big.txt" "$W/half."
t0=$(date +%s.%N)
spm_encode --model="$model" --output_format=id < "$W/half.aa" > /dev/null &
p1=$!
spm_encode --model="$model" --output_format=id < "$W/half.ab" > /dev/null &
p2=$!
wait $p1 $p2
t1=$(date +%s.%N)
rm -f "$W/half.aa" "$W/half.ab"
/usr/bin/python3 - "$W" "$t0" "$t1" <<'PYEOF'
import json, os, re, sys
w, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
tm = open(f"{w}/prepare.time").read()
def field(name):
    return re.search(re.escape(name) + r": (.*)", tm).group(1).strip()
wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall)))
rss_mb = int(field("Maximum resident set size (kbytes)")) / 1024
rep = json.load(open(f"{w}/report.json"))["sources"][0]
size = os.path.getsize(f"{w}/big.txt")
mb = size / 1e6
print(json.dumps({"name": "prepare", "bytes": size, "seconds": secs, "mb_s": mb / secs,
                  "peak_rss_mb": rss_mb, "docs_in": rep["docs_in"], "exact_duplicates": rep["exact_duplicates"],
                  "near_duplicates": rep["near_duplicates"], "filtered": sum(rep["filtered"].values()),
                  "docs_kept": rep["docs_kept"], "invalid_utf8_bytes": rep["invalid_utf8_bytes"]}))
print(json.dumps({"name": "spm_encode", "bytes": size, "seconds": t1 - t0, "mb_s": mb / (t1 - t0)}))
PYEOF
