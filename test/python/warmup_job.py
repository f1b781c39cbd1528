"""Run by test_jobs.py: the summing job with a standby warm-up that
appends this process's pid to the file argv[2] and then raises when
argv[3] is "raise". Prints `final step=<N> world=<W> sum=<x>`."""

import os
import sys

import torch

from sum_job import run_and_report, runtime_with_state

steps = int(sys.argv[1])
calls = sys.argv[2]
raises = sys.argv[3] == "raise"
rt, state = runtime_with_state()


def step(ctx):
    t = torch.full((4,), float(ctx.step * (ctx.rank + 1)), dtype=torch.float64)
    ctx.comm.all_reduce(t)
    state.add_(t)


def warmup():
    with open(calls, "a") as f:
        f.write(f"{os.getpid()}\n")
    if raises:
        raise RuntimeError("warm-up broke on purpose")


run_and_report(rt, step, steps, state, standby_warmup=warmup)
