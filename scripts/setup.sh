#!/usr/bin/env bash
# Installs holdfast's system dependencies from Debian packages and its
# Python packages from PyPI into the project's virtual environment .venv/
# (scripts/python-requirements.txt), both idempotent and non-interactive,
# then configures and builds into build/.
#
#   scripts/setup.sh [--no-build] [--build-type Release|Debug|RelWithDebInfo]
#                    [--sanitize address|thread]
#
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra CMake flags),
# HOLDFAST_WITH_NCCL (AUTO|ON|OFF, default AUTO), HOLDFAST_PYTHON (the
# interpreter that makes .venv/, default python3 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
build_type=Release
sanitize=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --build-type) build_type="$2"; shift ;;
    --sanitize) sanitize="$2"; shift ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

packages=(
  build-essential cmake ninja-build pkg-config git
  libgloo-dev libabsl-dev catch2 pybind11-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  python3-dev python3-venv
  nlohmann-json3-dev libxxhash-dev libcli11-dev libspdlog-dev libfmt-dev
  prometheus-cpp-dev libssl-dev clang-format
  iproute2 nftables patchelf ccache
  etcd-server
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Update the package lists only when they are absent or older than a day.
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    $sudo apt-get update -q
  fi
  if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    # A stale list can name versions the mirror no longer has: refresh once.
    $sudo apt-get update -q
    $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

# The virtual environment: made once, then brought to the pinned versions
# (pip leaves what already matches alone).
venv="$PWD/.venv"
if [ ! -x "$venv/bin/python3" ]; then
  echo "setup.sh: creating $venv"
  "${HOLDFAST_PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python3" -m pip install -q --disable-pip-version-check \
  -r scripts/python-requirements.txt

[ "$build" -eq 1 ] || exit 0

build_dir="${BUILD_DIR:-build}"
flags=(-G Ninja -DCMAKE_BUILD_TYPE="$build_type"
       -DHOLDFAST_WITH_NCCL="${HOLDFAST_WITH_NCCL:-AUTO}"
       -DPython_EXECUTABLE="$venv/bin/python3")
[ -n "$sanitize" ] && flags+=(-DHOLDFAST_SANITIZE="$sanitize")
# ccache, with paths under the checkout hashed relative to the build
# directory: `pip install .` from another copy of the tree (scripts/
# test_install.sh) then reuses these objects instead of compiling them again.
if command -v ccache >/dev/null; then
  launcher="env;CCACHE_BASEDIR=$PWD;ccache"
  flags+=(-DCMAKE_C_COMPILER_LAUNCHER="$launcher"
          -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
fi
# shellcheck disable=SC2206
[ -n "${CMAKE_ARGS:-}" ] && flags+=(${CMAKE_ARGS})
cmake -S . -B "$build_dir" "${flags[@]}"
cmake --build "$build_dir" -j "$(nproc)"
