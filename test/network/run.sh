#!/usr/bin/env bash
# CTest's entry to the network tests (label `network`): runs
# test_network.py, test_multinode.py and test_ha.py with pytest, or exits
# 77 (CTest: skipped) with the reason when test hosts cannot be made here
# (not root, no iproute2).
#
# A job on the test hosts keeps about one core busy: one case after
# another left the other core of a 2-core machine idle for 9 minutes
# (2026-11-29). So most cases run in two pytest processes at once, each on
# test hosts of its own (netns.py). The data-link cases whose verdict
# weighs which members reported whom, and when (a link cut for good or
# flapping, one pair blocked, a standby's host cut off), run afterwards
# with nothing beside them: with both cores busy, a cut host's second
# member was reported after the controller had judged the first alone, a
# bad NIC (1 run of 4). Each part's output follows once it has ended; the
# exit code is the first non-zero one.
#
#   test/network/run.sh PYTHON [PYTEST ARGS...]
set -u
python=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
why=$("$python" -c "import sys; sys.path.insert(0, '$here'); import netns; print(netns.available() or '')")
if [ -n "$why" ]; then
  echo "network tests skipped: $why"
  exit 77
fi
work=$(mktemp -d)
pids=()
trap 'rm -rf "$work"' EXIT
# CTest's timeout (or ^C) ends the pytest processes, not this script alone.
trap 'kill "${pids[@]}" 2>/dev/null; exit 143' TERM INT
net="$here/test_network.py"
alone="test_data_link_cut_for_good or test_data_link_flapping or test_one_pair_blocked or test_standby_host_loses_its_data_link"

start() {  # NAME ARGS...: pytest in the background, its output in $work/NAME.out
  local name=$1
  shift
  "$python" -m pytest -q -p no:cacheprovider --basetemp "$work/$name" "$@" \
    >"$work/$name.out" 2>&1 &
  pids+=($!)
}
report() {  # NAME PID TITLE: waits for the process; prints its output
  wait "$2"
  local rc=$?
  echo "== $3: exit $rc"
  cat "$work/$1.out"
  # 5: pytest collected nothing (PYTEST ARGS such as -k chose other parts).
  [ "$rc" -ne 5 ] || rc=0
  [ "$status" -ne 0 ] || status=$rc
}
status=0
start a "$net" -k "not test_lossy_data_link_names_its_host and not ($alone)" "$@"
start b "$net::test_lossy_data_link_names_its_host" "$here/test_multinode.py" \
  "$here/test_ha.py" "$@"
report a "${pids[0]}" "test_network.py, but for its lossy-link case and those run alone"
report b "${pids[1]}" "its lossy-link case, test_multinode.py and test_ha.py"
start c "$net" -k "$alone" "$@"
report c "${pids[2]}" "test_network.py's data-link cases, alone"
exit "$status"
