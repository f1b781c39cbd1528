#!/usr/bin/env bash
# The main demonstration: builds holdfast (installing what it needs), then
# runs ranks on loopback, kills one with SIGKILL and freezes one with SIGSTOP,
# and shows what every survivor observed. Arguments go to the demo program
# (see --help): for example  scripts/demo.sh --ranks 3 --victim 0
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
HOLDFAST_LOG_LEVEL="${HOLDFAST_LOG_LEVEL:-off}" exec build/holdfast-collectives-demo "$@"
