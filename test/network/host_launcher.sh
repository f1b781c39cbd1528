#!/usr/bin/env bash
# A test host's own launcher, as torchrun or a Slurm task prolog would be:
# a plain loop that starts this host's standbys, then its workers, each
# joining the job's controller through the environment, and waits for them.
#
#   host_launcher.sh OUT HOST FIRST_SLOT WORKERS STANDBYS -- CMD ARGS...
#
# The environment brings HOLDFAST_CONTROLLER, HOLDFAST_JOB_TOKEN,
# HOLDFAST_BIND_ADDR and HOLDFAST_TOPOLOGY_BLOCK. Each process gets
# HOLDFAST_HOST=HOST and HOLDFAST_PREFERRED_SLOT (its slot, or standby);
# its output goes to OUT/HOST-<w|s><i>.{out,err}, its pid to .pid and,
# once it exits, its exit code to .rc.
set -u
out=$1 host=$2 first=$3 workers=$4 standbys=$5
shift 5
[ "$1" = "--" ] && shift
pids=()
names=()
start() {
  local name=$1 slot=$2
  shift 2
  HOLDFAST_HOST=$host HOLDFAST_PREFERRED_SLOT=$slot "$@" \
    >"$out/$name.out" 2>"$out/$name.err" &
  echo $! >"$out/$name.pid"
  pids+=($!)
  names+=("$name")
}
for ((i = 0; i < standbys; i++)); do start "$host-s$i" standby "$@"; done
for ((i = 0; i < workers; i++)); do start "$host-w$i" $((first + i)) "$@"; done
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"
  echo $? >"$out/${names[$k]}.rc"
done
