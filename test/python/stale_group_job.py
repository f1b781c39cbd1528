"""Run by test_jobs.py under holdfast-run -n 3 --standby 1 with slot 1
killed at step KILL_STEP: the survivors issue that step's all-reduce
through torch.distributed (the "holdfast" group) only after the
controller has opened the next generation, as a DDP hook running late in
backward does. The group must fail that op (the step's error, then a
recovery) and not move to the new generation in the middle of the step,
where the standby is restoring. Prints
`final step=<N> world=<W> sum=<x>`."""

import sys
import time

import torch
import torch.distributed as dist

from sum_job import run_and_report, runtime_with_state
import holdfast.distributed as hd

steps = int(sys.argv[1])
kill_step = int(sys.argv[2])
rt, state = runtime_with_state()
hd.init_process_group(rt)


def step(ctx):
    if ctx.step == kill_step and ctx.generation == 0:
        # Slot 1 was killed as this step began; wait until the
        # controller has opened the next generation.
        deadline = time.monotonic() + 20
        while rt.generation == ctx.generation and time.monotonic() < deadline:
            time.sleep(0.01)
    t = torch.full((4,), float(ctx.step * (ctx.rank + 1)), dtype=torch.float64)
    dist.all_reduce(t)
    ctx.runtime.begin_state_update()
    state.add_(t)


result = run_and_report(rt, step, steps, state)
