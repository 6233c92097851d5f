#!/usr/bin/env bash
# bench/gpu/make_bundle.sh [OUT.tar.xz] — builds troupe's GPU checks on this (GPU-less)
# machine and packs them for a GPU machine that reaches no package registry and takes at
# most 64 MiB of files (issue 16):
#   bin/   troupe_cuda_tests, cuda_kernel_dump, troupe
#   lib/   the shared libraries they load that are not part of the base system (oneDNN,
#          CAF, UCX, ICU, ... as `ldd` lists them); left out on purpose: glibc, libstdc++
#          and libgcc_s (the target's are newer), libcuda (the driver's), and cuBLAS/cuBLASLt
#          (540 MB; run.sh takes the GPU image's own, from PyTorch's wheels or /usr/local/cuda)
#   bench/gpu/run.sh, bench/gpu/torch_check.py, BUILD_INFO
# Built with TROUPE_NATIVE=OFF (this machine's -march=native would emit AVX-512 FP16 that
# the GPU host may lack) in its own build folder, so build/ is untouched.
# Environment: BUILD (default build-gpu), JOBS (default 2), CUDA_ARCH (default 90).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/troupe-gpu-bundle.tar.xz}
BUILD=${BUILD:-$ROOT/build-gpu}
JOBS=${JOBS:-2}
LIMIT=$((64 * 1024 * 1024))
TARGETS="troupe_cuda_tests cuda_kernel_dump troupe"

command -v nvcc >/dev/null || { echo "make_bundle: nvcc is not on PATH; the CUDA code cannot be built here" >&2; exit 2; }
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_NATIVE=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" > "$BUILD.configure.log" 2>&1 ||
  { tail -20 "$BUILD.configure.log"; echo "make_bundle: cmake configure failed (log: $BUILD.configure.log)" >&2; exit 1; }
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$JOBS" --target $TARGETS

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/troupe-gpu
mkdir -p "$B/bin" "$B/lib" "$B/bench/gpu"
for t in $TARGETS; do cp "$BUILD/$t" "$B/bin/"; done
strip --strip-unneeded "$B"/bin/* 2>/dev/null || true
cp "$ROOT/bench/gpu/run.sh" "$ROOT/bench/gpu/torch_check.py" "$B/bench/gpu/"

# Shared libraries: everything ldd resolves except the base system and what the GPU image brings.
is_left_out() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libnvidia*) return 0 ;;                       # the driver's
    libcublas.so*|libcublasLt.so*|libcudart.so*) return 0 ;;   # the GPU image's CUDA (run.sh finds it)
  esac
  return 1
}
: > "$B/lib/LIBS.txt"
for f in "$B"/bin/*; do
  ldd "$f" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  if is_left_out "$name"; then
    echo "left out: $name ($path)" >> "$B/lib/LIBS.txt"
  else
    cp -L "$path" "$B/lib/$name"
    echo "packed:   $name ($path)" >> "$B/lib/LIBS.txt"
  fi
done
# UCX loads its transports as modules at run time (ldd does not list them)
if [ -f "$B/lib/libucs.so.0" ] && [ -d /usr/lib/x86_64-linux-gnu/ucx ]; then
  mkdir -p "$B/lib/ucx" && cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$B/lib/ucx/"
  echo "packed:   ucx/ modules (/usr/lib/x86_64-linux-gnu/ucx)" >> "$B/lib/LIBS.txt"
fi
{
  echo "troupe GPU bundle"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(uname -n), $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "cuda architectures: ${CUDA_ARCH:-90}; TROUPE_NATIVE=OFF"
  echo "max GLIBC symbol version needed: $(objdump -T "$B"/bin/* "$B"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
} > "$B/BUILD_INFO"

tar -C "$STAGE" --xz -cf "$OUT" troupe-gpu
size=$(stat -c %s "$OUT")
echo "make_bundle: $OUT: $size bytes ($((size / 1024 / 1024)) MiB; limit 64 MiB)"
sed 's/^/  /' "$B/lib/LIBS.txt"
if [ "$size" -gt "$LIMIT" ]; then
  echo "make_bundle: the bundle is over 64 MiB: leave troupe out (TARGETS) or strip more" >&2
  exit 1
fi
