#!/bin/sh
# Runs one rank of a GPU test job: every process of the job uses device 0,
# and NCCL refuses two ranks of one communicator on one device of one
# host, so each process gets a host id of its own (NCCL_HOSTID) and the
# ranks talk over NCCL's socket transport on loopback.
# HOLDFAST_RANK_STATUS=1: runs the command as a child and prints how it
# ended (a signal's number shows as status 128+N). HOLDFAST_RANK_GDB=1:
# runs it under cuda-gdb (the GPU machine has no gdb), which prints every
# thread's backtrace if it crashes.
export NCCL_HOSTID="holdfast-$$"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export NCCL_IB_DISABLE=1
export HOLDFAST_DEVICE="${HOLDFAST_DEVICE:-0}"
if [ -n "${HOLDFAST_RANK_GDB:-}" ]; then
  exec cuda-gdb -q -batch -ex "set pagination off" -ex "handle SIGUSR1 nostop noprint pass" \
    -ex "set print thread-events off" \
    -ex run -ex "bt 40" -ex "info threads" -ex "thread apply all bt 30" --args "$@"
fi
if [ -n "${HOLDFAST_RANK_STATUS:-}" ]; then
  "$@"
  status=$?
  echo "gpu_rank: $1 ... ended with status $status" >&2
  exit $status
fi
exec "$@"
