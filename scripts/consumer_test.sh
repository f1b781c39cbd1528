#!/usr/bin/env bash
# Installs the build in BUILD_DIR into a fresh prefix, builds
# examples/consumer against it with find_package(holdfast), and runs it.
# Usage: scripts/consumer_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/holdfast-consumer-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/holdfast/version.h"
cmake -S "$root/examples/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/consumer"
