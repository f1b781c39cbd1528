"""What the small summing test jobs share (late_death_job.py,
stale_group_job.py, verdict_job.py, warmup_job.py): a runtime with 4
float64 of replicated state, and a run that prints `final step=<N>
world=<W> sum=<x>`, after a line per recovery with its stages' times."""

import sys

import torch

import holdfast


def runtime_with_state():
    """A Runtime (HOLDFAST_* environment) and its registered state."""
    rt = holdfast.Runtime()
    state = torch.zeros(4, dtype=torch.float64)
    rt.register_tensor("state", state)
    return rt, state


def run_and_report(rt, step, steps, state, **run_args):
    """rt.run(step, steps, **run_args), then the final line; returns the
    RunResult. A standby that was never needed exits 0."""
    try:
        result = rt.run(step, steps, **run_args)
    except holdfast.CancelledError:
        sys.exit(0)
    for r in result.recoveries:
        print(f"recovery generation={r.generation} stages_ms="
              f"{r.seen_ms},{r.aborted_ms},{r.agreed_ms},{r.rebuilt_ms},"
              f"{r.restored_ms},{r.first_step_ms} comm_up_ms={r.comm_up_ms}",
              flush=True)
    print(f"final step={result.final_step} world={result.world_size} "
          f"sum={state.sum().item()}", flush=True)
    return result
