"""What the holdfast examples share around Runtime.run: their exit codes
and their last lines."""

import sys

import holdfast


def run(name, call):
    """Returns (call()'s RunResult, None), or (None, the exit code) when it
    raised a holdfast error, which is printed: 0 for a standby that was
    never needed, 3 fenced, 4 the job stopped, 1 any other."""
    codes = ((holdfast.CancelledError, 0), (holdfast.FencedError, 3),
             (holdfast.AbortedError, 4), (holdfast.HoldfastError, 1))
    try:
        return call(), None
    except holdfast.HoldfastError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return None, next(code for kind, code in codes if isinstance(e, kind))


def report(result, loss, digest):
    """The snapshot counts (stderr) and the final line (stdout)."""
    print(f"recoveries={len(result.recoveries)} loss={loss:.6f} "
          f"snapshots_overlapped={result.snapshots_overlapped} "
          f"snapshots_unfenced={result.snapshots_unfenced}", file=sys.stderr)
    print(f"final step={result.final_step} world={result.world_size} "
          f"params_sha256={digest}", flush=True)
