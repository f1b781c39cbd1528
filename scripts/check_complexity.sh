#!/usr/bin/env bash
# Fails if a function in src/ runs over 80 lines or a cyclomatic
# complexity of 25 (lizard), except the option and binding tables below,
# which are long lists by nature. Run by CTest (check label).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-.venv/bin/python3}"
# Tables: one entry per option or bound method.
allowed='holdfast::config::Registry|holdfast::BindCommunicator|holdfast::BindRuntime'
out=$("$python" -m lizard -L 80 -C 25 -w src 2>&1 || true)
if ! grep -q "warning" <<<"$out" && grep -qi "error\|no module" <<<"$out"; then
  echo "complexity: lizard did not run: $out" >&2
  exit 1
fi
bad=$(grep "warning" <<<"$out" | grep -Ev " ($allowed) has " || true)
if [ -n "$bad" ]; then
  echo "complexity: functions over 80 lines or a complexity of 25 (split them):" >&2
  echo "$bad" >&2
  exit 1
fi
echo "complexity: no function in src/ over 80 lines or a complexity of 25 but the tables"
