"""Run by test_jobs.py: a program error no recovery can mend. From step 3 on,
slot 1 all-reduces 8 elements where slot 0 all-reduces 4; with the argument
`p2p`, slot 0 sends 4 elements (tag 3) and slot 1 receives 8 instead.
Prints `final step=<N> ...` only if a run ends normally, which it must not;
a holdfast error is printed as `error: <class> <message>` (exit 1)."""

import sys

import torch

import holdfast

rt = holdfast.Runtime()
state = torch.zeros(4, dtype=torch.float64)
rt.register_tensor("state", state)


P2P = sys.argv[1:] == ["p2p"]


def step(ctx):
    n = 8 if ctx.rank == 1 and ctx.step >= 3 else 4
    t = torch.ones(n, dtype=torch.float64)
    if not P2P:
        ctx.comm.all_reduce(t)
    elif ctx.rank == 0:
        ctx.comm.send(t, 1, tag=3)
    else:
        ctx.comm.recv(t, 0, tag=3)
    state.add_(t[:4])


try:
    result = rt.run(step, 6)
except holdfast.CancelledError:
    sys.exit(0)  # a standby that was never needed
except holdfast.HoldfastError as e:
    print(f"error: {type(e).__name__} {e}", flush=True)
    sys.exit(1)
print(f"final step={result.final_step} world={result.world_size}", flush=True)
