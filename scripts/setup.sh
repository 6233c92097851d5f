#!/usr/bin/env bash
# Installs every dependency of troupe from Debian packages. Idempotent: packages
# already present are not touched, and nothing is downloaded when all are there.
#   scripts/setup.sh              build + test dependencies
#   scripts/setup.sh --reference  also python3-torch (only bench/reference needs it)
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config ccache
  libcaf-dev libucx-dev ucx-utils libcapnp-dev capnproto
  libspdlog-dev libfmt-dev catch2
  libsentencepiece-dev sentencepiece libicu-dev
  libopenblas-dev libblis-dev libdnnl-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev libssl-dev
  libprotobuf-dev protobuf-compiler gnuplot-nox
  npm strace  # strace: the tests inject failing system calls (flock ENOLCK, clone EAGAIN)
)
if [[ "${1:-}" == "--reference" ]]; then
  PKGS+=(python3-torch python3-numpy)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # npm may come from NodeSource / the image rather than Debian: accept a working one.
    if [[ "$p" == npm ]] && command -v npm >/dev/null 2>&1; then continue; fi
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
