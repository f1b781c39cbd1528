#!/usr/bin/env bash
# Sets up, builds and runs every test through CTest. Exits non-zero on any
# failure. Extra arguments go to ctest (for example: -R gloo -V).
#
# HOLDFAST_TEST_SANITIZE=address|thread also builds into build-<name>/ with
# that sanitizer and runs the suite there.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
ctest --test-dir build --output-on-failure --timeout 300 -j 2 "$@"
# `pip install .` into a fresh virtual environment, and the Python suite
# from that install (HOLDFAST_SKIP_INSTALL_TEST=1 skips it: several minutes).
if [ -z "${HOLDFAST_SKIP_INSTALL_TEST:-}" ]; then
  bash scripts/test_install.sh
fi

if [ -n "${HOLDFAST_TEST_SANITIZE:-}" ]; then
  BUILD_DIR="build-${HOLDFAST_TEST_SANITIZE}" bash scripts/setup.sh \
    --build-type RelWithDebInfo --sanitize "${HOLDFAST_TEST_SANITIZE}"
  # A UBSan finding ends the process (and so fails its test) instead of
  # scrolling past in a child's log.
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
    ctest --test-dir "build-${HOLDFAST_TEST_SANITIZE}" --output-on-failure \
    --timeout 600 -j 2 "$@"
fi
