#!/usr/bin/env bash
# CTest's entry to the network tests (label `network`): runs
# test_network.py, test_multinode.py and test_ha.py with pytest, or exits
# 77 (CTest: skipped) with the reason when test hosts cannot be made here
# (not root, no iproute2).
#
# Two pytest processes at once, each on test hosts of its own (netns.py):
# a job on the test hosts keeps about one core busy, so one process left
# the other core of a 2-core machine idle for 9 minutes (2026-11-29; 5.6
# minutes in two). The first runs test_network.py but for its lossy-link
# and blocked-pair cases; the second runs those, test_multinode.py and
# test_ha.py. Their outputs follow each other once both have ended; the
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
trap 'rm -rf "$work"' EXIT
"$python" -m pytest -q -p no:cacheprovider --basetemp "$work/a" \
  "$here/test_network.py" -k "not test_lossy_data_link and not test_one_pair_blocked" \
  "$@" >"$work/a.out" 2>&1 &
a=$!
"$python" -m pytest -q -p no:cacheprovider --basetemp "$work/b" \
  "$here/test_network.py::test_lossy_data_link_names_its_host" \
  "$here/test_network.py::test_lossy_data_link_replaced_under_the_straggler_policy" \
  "$here/test_network.py::test_one_pair_blocked" \
  "$here/test_multinode.py" "$here/test_ha.py" \
  "$@" >"$work/b.out" 2>&1 &
b=$!
# CTest's timeout (or ^C) ends both, not this script alone.
trap 'kill "$a" "$b" 2>/dev/null; exit 143' TERM INT
wait "$a"
rc_a=$?
wait "$b"
rc_b=$?
echo "== test_network.py (but its lossy-link and blocked-pair cases): exit $rc_a"
cat "$work/a.out"
echo "== its lossy-link and blocked-pair cases, test_multinode.py, test_ha.py: exit $rc_b"
cat "$work/b.out"
if [ "$rc_a" -ne 0 ]; then exit "$rc_a"; fi
exit "$rc_b"
