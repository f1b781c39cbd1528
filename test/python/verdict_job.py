"""Run by test_jobs.py: a job that trains to the end and then goes wrong in
one of the ways holdfast-run's exit code must tell (tools/launcher.h).
argv: STEPS MODE, MODE one of
  worker_exit   slot 1 finishes training, then exits with code 1 (as a
                trainer whose final hashing needs a missing package does);
  flip          in the last step, after the state update, a separate
                process flips one bit of slot 2's replicated state through
                /proc/<pid>/mem;
  standby_fail  a standby that takes a slot raises in its first step.
Prints `final step=<N> world=<W> sum=<x>`."""

import ctypes
import subprocess
import sys

import torch

from sum_job import run_and_report, runtime_with_state

steps = int(sys.argv[1])
mode = sys.argv[2]
rt, state = runtime_with_state()
was_standby = rt.standby

FLIP = """
import sys
pid, address = int(sys.argv[1]), int(sys.argv[2])
with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
    mem.seek(address)
    byte = mem.read(1)[0]
    mem.seek(address)
    mem.write(bytes([byte ^ 0x10]))
"""


def flip_from_outside():
    # Lets another process write into this one where ptrace is restricted
    # (PR_SET_PTRACER, PR_SET_PTRACER_ANY).
    ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)
    subprocess.run([sys.executable, "-c", FLIP, str(ctypes.CDLL(None).getpid()),
                    str(state.data_ptr() + 3)], check=True)


def step(ctx):
    if mode == "standby_fail" and was_standby:
        raise RuntimeError("verdict_job: this standby cannot train")
    t = torch.full((4,), float(ctx.step * (ctx.rank + 1)), dtype=torch.float64)
    ctx.comm.all_reduce(t)
    ctx.runtime.begin_state_update()
    state.add_(t)
    if mode == "flip" and ctx.step == steps and ctx.rank == 2:
        flip_from_outside()


result = run_and_report(rt, step, steps, state)
if mode == "worker_exit" and result.slot == 1:
    sys.exit(1)
