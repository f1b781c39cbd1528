#!/usr/bin/env bash
# Installs the peers that benchmarks/peers/run.py compares holdfast with,
# from PyPI, pinned, into the project's virtual environment (.venv/, made
# by scripts/setup.sh). Idempotent: pip leaves what already matches alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="$PWD/.venv"
if [ ! -x "$venv/bin/python3" ]; then
  echo "benchmarks/peers/setup.sh: no $venv; run scripts/setup.sh first" >&2
  exit 1
fi
"$venv/bin/python3" -m pip install -q --disable-pip-version-check \
  -r benchmarks/peers/requirements.txt
