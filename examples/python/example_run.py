"""What the holdfast examples share around Runtime.run: their exit codes
and their last lines."""

import faulthandler
import os
import signal
import sys

import torch

import holdfast


# A crash (SIGSEGV, SIGABRT, ...) prints every thread's Python stack, and
# so does SIGUSR1 (a job that hangs can be asked where).
faulthandler.enable(all_threads=True)
faulthandler.register(signal.SIGUSR1, all_threads=True)


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


def device(kind):
    """The torch device a trainer computes on for --device `kind`, and the
    Runtime options that go with it: "cpu" trains on Gloo; "cuda" on the
    GPU of HOLDFAST_DEVICE (else LOCAL_RANK, else 0), over NCCL, with
    deterministic cuBLAS (so that a recovered run can match the
    fault-free one bit for bit)."""
    if kind == "cpu":
        return torch.device("cpu"), {}
    index = int(os.environ.get("HOLDFAST_DEVICE",
                               os.environ.get("LOCAL_RANK", "0")))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.cuda.set_device(index)
    return torch.device("cuda", index), {"backend": "nccl", "device": index}
