#!/usr/bin/env bash
# CTest's entry to the network tests (label `network`): runs
# test_network.py, test_multinode.py and test_ha.py with pytest, or exits
# 77 (CTest: skipped) with the reason when test hosts cannot be made here
# (not root, no iproute2).
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
exec "$python" -m pytest -q -p no:cacheprovider "$here/test_network.py" \
  "$here/test_multinode.py" "$here/test_ha.py" "$@"
