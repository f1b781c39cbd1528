#!/usr/bin/env bash
# Fails if any C++ file differs from .clang-format's style. Run by CTest.
# Fix with: scripts/check_format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.h' '*.cc' '*.c' '*.inc' 2>/dev/null || find include src test benchmarks examples third_party -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.inc')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run -Werror "${files[@]}"
# Catch2 splits test filters at commas and CMake splits test names at
# semicolons, so CTest could never select such a test: it would silently
# not run (ctest runs Catch with --warn NoTests, which catches the rest).
if grep -n 'TEST_CASE("[^"]*[,;]' test/*.cc; then
  echo "format: test names must not contain commas or semicolons" >&2
  exit 1
fi
echo "format: ${#files[@]} files clean"
