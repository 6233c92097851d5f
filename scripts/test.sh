#!/usr/bin/env bash
# make test: every ctest entry in BUILD (default build/), JOBS at a time (default: the
# CPUs here), then each one that failed run again alone. A few tests send a signal or
# remove a file while a troupe process works, at a moment that a busy neighbour can
# shift; a test that fails alone too fails `make test`.
set -uo pipefail
build=${BUILD:-build}
jobs=${JOBS:-$(nproc)}
cd "$build" || { echo "make test: no build folder '$build'; run make build first" >&2; exit 2; }
if ctest -j "$jobs" --output-on-failure --timeout 900; then exit 0; fi
echo "make test: running the tests that failed again, one at a time (see above for their first output)"
ctest --rerun-failed --output-on-failure --timeout 900
