"""Run by test_jobs.py: slot 1 SIGKILLs itself at the very end of the last
step, after its collectives, so the other slot has finished every step and
waits for the last backup round when the loss is seen. The marker file makes it fire once per job.
Prints `final step=<N> world=<W> sum=<x>`."""

import os
import signal
import sys
import time

import torch

from sum_job import run_and_report, runtime_with_state

steps = int(sys.argv[1])
marker = sys.argv[2]
rt, state = runtime_with_state()


def step(ctx):
    t = torch.full((4,), float(ctx.step * (ctx.rank + 1)), dtype=torch.float64)
    ctx.comm.all_reduce(t)
    state.add_(t)
    if ctx.rank == 1 and ctx.step == steps and not os.path.exists(marker):
        open(marker, "w").close()
        # Long enough for slot 0 to finish the step and snapshot it: it is
        # waiting for the last backup round when the loss is seen.
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)


result = run_and_report(rt, step, steps, state)
