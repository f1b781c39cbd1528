"""Run by test_gpu.py under holdfast-run -n 3 on one GPU (NCCL): the
"holdfast" torch.distributed group on CUDA tensors, with
ProcessGroupNCCL's stream semantics, and the Communicator of the step
context on CUDA tensors. Prints `ok rank=<r>`."""

import os
import sys

import torch
import torch.distributed as dist

import holdfast
import holdfast.distributed as hd

device = torch.device("cuda", int(os.environ.get("HOLDFAST_DEVICE", "0")))
torch.cuda.set_device(device)
rt = holdfast.Runtime(backend="nccl", device=device.index)
weights = torch.arange(4, dtype=torch.float32, device=device)
rt.register_tensor("weights", weights)
hd.init_process_group(rt)


def check_stream_order(ctx):
    """The all-reduce starts after the work queued before it on the
    current stream (a kernel that sleeps, then the fill), and wait()
    returns before the device is done: it orders the stream, it does not
    block the host."""
    r, n = ctx.rank, ctx.world_size
    want = float(n * (n + 1) // 2)

    def timed_all_reduce():
        t = torch.zeros(1 << 20, device=device)
        torch.cuda._sleep(200_000_000)  # about 0.1 s of one SM's cycles
        t.fill_(float(r + 1))
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        pending_after_wait = not torch.cuda.current_stream().query()
        assert bool((t == want).all()), t[:4]
        return pending_after_wait

    # The first collective of a communicator may wait for the device:
    # NCCL connects its channels and allocates on first use (as under
    # ProcessGroupNCCL). Printed, not asserted; the next one must not.
    print(f"cold all_reduce left the stream busy: {timed_all_reduce()}",
          flush=True)
    assert timed_all_reduce(), "work.wait() synchronised the host"


def step(ctx):
    r, n = ctx.rank, ctx.world_size
    check_stream_order(ctx)
    # Every dist collective FSDP2 and DDP use, on CUDA tensors.
    t = torch.full((5,), float(r + 1), device=device)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(n * (n + 1) // 2),
                                     device=device)), t
    t = torch.full((3,), float(r + 1), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert torch.equal(t.cpu(), torch.full((3,), float(n),
                                           dtype=torch.float64))
    b = torch.arange(4, dtype=torch.int64, device=device) * (r + 10)
    dist.broadcast(b, src=1)
    assert torch.equal(b.cpu(), torch.arange(4, dtype=torch.int64) * 11), b
    out = torch.empty(n * 2, dtype=torch.int32, device=device)
    dist.all_gather_into_tensor(
        out, torch.tensor([r, -r], dtype=torch.int32, device=device))
    want = torch.tensor([v for k in range(n) for v in (k, -k)],
                        dtype=torch.int32)
    assert torch.equal(out.cpu(), want), out
    outs = [torch.empty(2, device=device) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r), device=device))
    assert [float(o[0]) for o in outs] == [float(k) for k in range(n)], outs
    inp = torch.arange(n * 2, dtype=torch.float32, device=device) + r
    got = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(got, inp)
    base = torch.arange(n * 2, dtype=torch.float32)[2 * r:2 * r + 2]
    assert torch.equal(got.cpu(), base * n + n * (n - 1) / 2), got
    dist.barrier()
    # A sum in slot order: the same bits wherever the elements sit.
    x = (torch.arange(1000, device=device, dtype=torch.float32) * 0.1 +
         (r + 1) / 3.0)
    y = torch.cat([torch.zeros(7, device=device), x])
    dist.all_reduce(x)
    dist.all_reduce(y)
    assert torch.equal(x, y[7:]), "a sum depended on the elements' position"
    # NCCL's own all-reduce (the step Communicator's, unchanged) on the
    # same operands: whether its bits depend on the position (reported).
    x = (torch.arange(1000, device=device, dtype=torch.float32) * 0.1 +
         (r + 1) / 3.0)
    y = torch.cat([torch.zeros(7, device=device), x])
    ctx.comm.all_reduce(x)
    ctx.comm.all_reduce(y)
    if r == 0 and ctx.step == 1:
        print("nccl all_reduce position-dependent: "
              f"{not torch.equal(x, y[7:])} "
              f"({int((x != y[7:]).sum())} of 1000 elements differ)",
              flush=True)
    # The step's Communicator on CUDA tensors (blocking calls).
    c = ctx.comm
    t = torch.full((6,), float(r + 1), device=device)
    c.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((6,), float(n * (n + 1) // 2)))
    try:
        c.all_reduce(torch.zeros(2))
    except holdfast.InvalidArgumentError as e:
        assert "CUDA tensors" in str(e), e
    else:
        raise AssertionError("a CPU tensor on NCCL was not refused")
    ctx.runtime.begin_state_update()
    weights.add_(1.0)


result = rt.run(step, 2)
torch.cuda.synchronize()
assert torch.equal(weights.cpu(), torch.arange(4, dtype=torch.float32) + 2)
print(f"ok rank={result.slot}", flush=True)
sys.exit(0)
