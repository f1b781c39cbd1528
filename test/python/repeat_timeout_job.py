"""Run by test_jobs.py: a failure that comes back every time the steps are
redone. At step 3 slot 1 computes for 0.6 s before an all-reduce that slot
0 gives 0.2 s (an op timeout too short for the step), on every attempt.
Prints `final step=<N> ...` only if a run ends normally, which it must not;
a holdfast error is printed as `error: <class> <message>` (exit 1)."""

import sys
import time

import torch

import holdfast

rt = holdfast.Runtime(max_step_retries=2)
state = torch.zeros(4, dtype=torch.float64)
rt.register_tensor("state", state)


def step(ctx):
    t = torch.ones(4, dtype=torch.float64)
    if ctx.step == 3:
        if ctx.rank == 1:
            time.sleep(0.6)
        ctx.comm.all_reduce(t, timeout=0.2)
    else:
        ctx.comm.all_reduce(t)
    state.add_(t)


try:
    result = rt.run(step, 6)
except holdfast.HoldfastError as e:
    print(f"error: {type(e).__name__} {e}", flush=True)
    sys.exit(1)
print(f"final step={result.final_step} world={result.world_size}", flush=True)
