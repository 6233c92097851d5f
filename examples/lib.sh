# examples/lib.sh — what the example scripts share (sourced, not run):
#   TROUPE   the troupe binary: $1 of the script, else $TROUPE, else build/troupe
#   WORK     a scratch folder, removed at exit (kept when KEEP=1)
#   TINY     train options for the tiny job (configs/tiny.toml, its data cache in WORK)
#   losses RUN_DIR   "step loss" per line from metrics.jsonl (the last record of a step wins)
#   check COND_TEXT  fails the example with a message when the last command failed
# The scripts run from the repository root (configs/ and tests/data/ are relative).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TROUPE=$(realpath "${1:-${TROUPE:-build/troupe}}")
WORK=$(mktemp -d /tmp/troupe-example-XXXXXX)
if [[ "${KEEP:-0}" == 1 ]]; then echo "(work folder kept: $WORK)"; else trap 'rm -rf "$WORK"' EXIT; fi
TINY=(--config configs/tiny.toml --set "data.cache_dir=$WORK/cache" --set train.sample_tokens=0
      --set train.eval_batches=1 --set train.eval_interval=0)

losses() {
  sed -n 's/.*"loss":\([^,]*\),.*"step":\([0-9]*\).*/\2 \1/p' "$1/metrics.jsonl" |
    awk '{ last[$1] = $2 } END { for (k in last) print k, last[k] }' | sort -n
}

fail() {
  echo "example failed: $*" >&2
  exit 1
}
