#!/usr/bin/env bash
# The main demonstration: builds holdfast (installing what it needs), then
# trains the deterministic data-parallel example under holdfast-run four
# times: fault-free, with a rank SIGKILLed, with a rank frozen by SIGSTOP,
# and in ZeRO-1 mode (sharded optimizer state) with a whole fake host of two
# ranks lost. Each faulty run recovers in process (warm standbys take the
# slots; the lost ranks' checkpoint pieces come from their buddies on the
# other host) and ends with the same parameter hash as the fault-free run.
# Then a PyTorch DDP trainer (examples/python) twice: fault-free and with a
# rank SIGKILLed, again with equal hashes.
#
#   scripts/demo.sh [STEPS]           default 200 steps, 4 ranks, 1 standby
#   scripts/demo.sh --collectives ... the communicator demo (kill and freeze
#                                     a rank inside collectives; see --help)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
if [ "${1:-}" = "--collectives" ]; then
  shift
  HOLDFAST_LOG_LEVEL="${HOLDFAST_LOG_LEVEL:-off}" exec build/holdfast-collectives-demo "$@"
fi

steps="${1:-200}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export HOLDFAST_LOG_LEVEL="${HOLDFAST_LOG_LEVEL:-warn}"

run() {
  local name="$1" trainer_args=""
  shift
  if [ "$name" = node ]; then trainer_args="--zero1"; fi
  echo
  echo "=== $name: holdfast-run -n 4 $* -- holdfast-dp-trainer --steps $steps $trainer_args"
  build/holdfast-run -n 4 --silent-after-ms 2000 --log-dir "$out/$name" "$@" \
    -- build/holdfast-dp-trainer --steps "$steps" --step-ms 5 $trainer_args \
    >"$out/$name.out" 2>"$out/$name.err" || true
  grep -h "final step=" "$out/$name.out" | sort
  sed -n '/==== holdfast-run summary ====/,$p' "$out/$name.err"
}

run fault-free --standby 1
run kill --standby 1 --inject "kill:slot=2:step=$((steps / 3))"
run hang --standby 1 --inject "hang:slot=1:step=$((steps / 2))"
# host0 runs slots 0 and 1; both die one step apart.
run node --standby 2 --hosts 2 --inject "kill:slot=0:step=$((steps / 2))" \
  --inject "kill:slot=1:step=$((steps / 2 + 1))"

hash() { grep -ho "params_sha256=[0-9a-f]*" "$out/$1.out" | sort -u; }
# True when the named runs printed one distinct hash between them (the
# first run printed one).
one_hash() {
  [ "$(for name in "$@"; do hash "$name"; done | sort -u | wc -l)" = 1 ] &&
    [ -n "$(hash "$1")" ]
}
echo
echo "=== final state hashes (one line per distinct hash)"
for name in fault-free kill hang node; do
  printf '%-10s %s\n' "$name" "$(hash "$name" | tr '\n' ' ')"
done
if one_hash fault-free kill hang node; then
  echo "equal: every rank of every run ended with the fault-free state"
else
  echo "DIFFERENT: the runs did not end with the same parameters" >&2
  exit 1
fi

# PyTorch DDP on the "holdfast" torch.distributed backend (torch from the
# project's .venv/): fault-free, then slot 1 SIGKILLed.
pyrun() {
  local name="$1"
  shift
  echo
  echo "=== $name: holdfast-run -n 2 --standby 1 $* -- ddp_train.py --steps 40"
  PYTHONPATH=build/python build/holdfast-run -n 2 --standby 1 \
    --log-dir "$out/$name" "$@" \
    -- .venv/bin/python3 examples/python/ddp_train.py --steps 40 \
    >"$out/$name.out" 2>"$out/$name.err" || true
  grep -h "final step=" "$out/$name.out" | sort
  sed -n '/==== holdfast-run summary ====/,$p' "$out/$name.err"
}
pyrun py-fault-free
pyrun py-kill --inject "kill:slot=1:step=20"
echo
if one_hash py-fault-free py-kill; then
  echo "equal: the DDP run with a kill ended with the fault-free state"
else
  echo "DIFFERENT: the DDP runs did not end with the same parameters" >&2
  exit 1
fi
