"""Run by test_jobs.py under holdfast-run -n 3: every collective of the
torch Communicator and of the "holdfast" torch.distributed group, checked
against the values every rank can compute. Prints `ok rank=<r>`."""

import os
import pathlib
import re
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import holdfast
import holdfast.distributed as hd

# The call outside a step below builds the first communicator before
# run() has waited for every member to join: give a rank that starts late
# (a loaded machine) more than the default 15 s to come.
rt = holdfast.Runtime(connect_timeout=120)
marker = torch.zeros(1)
rt.register_tensor("marker", marker)
pg = hd.init_process_group(rt)
assert dist.get_backend() == "holdfast"
# Registered for the devices it serves (torch 2.x's register_backend).
assert dist.Backend.backend_capability["holdfast"] == ["cpu", "cuda"], (
    dist.Backend.backend_capability)


def _word_of_rank0(ctx):
    """A file every rank of this job and step can name, for rank 0's word."""
    job = re.sub(r"[^0-9A-Za-z]", "_", os.environ.get("HOLDFAST_CONTROLLER", ""))
    return pathlib.Path(tempfile.gettempdir()) / (
        f"holdfast-async-{job}-{ctx.generation}-{ctx.step}")


def check_asynchronous(ctx):
    """Rank 0's all-reduce returns before the others issue theirs: they
    wait for its word, which it gives only once the call returned (an
    operation that blocked would never see the others join)."""
    r, n = ctx.rank, ctx.world_size
    word = _word_of_rank0(ctx)
    t = torch.full((3,), float(r + 1))
    if r == 0:
        work = dist.all_reduce(t, async_op=True)
        done_at_return = work.is_completed()
        word.write_text("issued")
        work.wait()
        word.unlink()
        assert not done_at_return, "the all-reduce completed before its peers"
    else:
        deadline = time.monotonic() + 30
        while not word.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("rank 0's all-reduce did not return before "
                                   "its peers issued theirs")
            time.sleep(0.01)
        dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(n * (n + 1) // 2))), t


def check_views_and_refusals(r, n):
    """Tensors that are views with strides (not contiguous) get the
    answer, in place, and nothing around them changes; a dtype the group
    does not take is refused by name at the call."""
    base = torch.zeros(4, 3)
    base[:, 1] = r + 1
    dist.all_reduce(base[:, 1])
    assert torch.equal(base[:, 1], torch.full((4,), float(n * (n + 1) // 2))), base
    assert not base[:, 0].any() and not base[:, 2].any(), base
    grid = torch.zeros(3, 4)
    grid[:, 2] = 10 * r + torch.arange(3.0)
    dist.broadcast(grid[:, 2], src=1)
    assert torch.equal(grid[:, 2], 10 + torch.arange(3.0)), grid
    assert grid[:, [0, 1, 3]].eq(0).all(), grid
    wide = torch.zeros(n, 4)
    dist.all_gather([wide[k, ::2] for k in range(n)], torch.full((2,), float(r)))
    assert torch.equal(wide[:, ::2], torch.arange(float(n)).repeat_interleave(
        2).view(n, 2)), wide
    assert not wide[:, 1::2].any(), wide
    whole = torch.zeros(n * 2, 2)
    dist.all_gather_into_tensor(whole[:, 0], torch.full((2,), float(r)))
    assert torch.equal(whole[:, 0], torch.arange(float(n)).repeat_interleave(2))
    assert not whole[:, 1].any(), whole
    # torch sends complex numbers as pairs of reals.
    z = torch.full((2,), complex(r, -r), dtype=torch.complex64)
    dist.all_reduce(z)
    s = float(sum(range(n)))
    assert torch.equal(z, torch.full((2,), complex(s, -s),
                                     dtype=torch.complex64)), z
    try:
        dist.all_reduce(torch.zeros(2, dtype=torch.int16))
    except Exception as e:  # noqa: BLE001 -- torch may rewrap the type
        assert "int16" in str(e), e
    else:
        raise AssertionError("an all_reduce of int16 was accepted")


def step(ctx):
    r, n = ctx.rank, ctx.world_size
    c = ctx.comm
    t = torch.full((5,), float(r + 1))
    c.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(n * (n + 1) // 2))), t
    t = torch.full((3,), float(r + 1), dtype=torch.float64)
    c.all_reduce(t, op="max")
    assert torch.equal(t, torch.full((3,), float(n), dtype=torch.float64))
    b = torch.arange(4, dtype=torch.int64) * (r + 10)
    c.broadcast(b, root=1)
    assert torch.equal(b, torch.arange(4, dtype=torch.int64) * 11), b
    out = torch.empty(n * 2, dtype=torch.int32)
    c.all_gather(out, torch.tensor([r, -r], dtype=torch.int32))
    want = torch.tensor([v for k in range(n) for v in (k, -k)],
                        dtype=torch.int32)
    assert torch.equal(out, want), out
    inp = torch.arange(n * 2, dtype=torch.float32) + r
    got = torch.empty(2)
    c.reduce_scatter(got, inp)
    base = torch.arange(n * 2, dtype=torch.float32)[2 * r:2 * r + 2]
    assert torch.equal(got, base * n + sum(range(n))), got
    a2a = torch.tensor([100 * r + k for k in range(n)], dtype=torch.float32)
    back = torch.empty(n)
    c.all_to_all(back, a2a)
    assert torch.equal(back, torch.tensor([100.0 * k + r for k in range(n)]))
    c.barrier()
    if r == 0:
        c.send(torch.tensor([7.0, 8.0]), peer=1, tag=3)
    elif r == 1:
        got = c.recv(torch.empty(2), peer=0, tag=3)
        assert torch.equal(got, torch.tensor([7.0, 8.0]))
    # The same through torch.distributed's API on the holdfast group.
    d = torch.full((4,), float(r))
    dist.all_reduce(d)
    assert torch.equal(d, torch.full((4,), float(sum(range(n)))))
    parts = [torch.empty(2) for _ in range(n)]
    dist.all_gather(parts, torch.full((2,), float(r)))
    assert all(torch.equal(p, torch.full((2,), float(k)))
               for k, p in enumerate(parts))
    e = torch.full((2,), float(r))
    dist.broadcast(e, src=2)
    assert torch.equal(e, torch.full((2,), 2.0))
    dist.barrier()
    check_views_and_refusals(r, n)
    check_asynchronous(ctx)
    assert pg.size() == n and pg.rank() == r
    marker.add_(1)


# Outside a step an operation's error is raised by the call (the Work a
# backend returns does not raise it in wait()).
try:
    dist.all_gather([torch.empty(2) for _ in range(2)], torch.zeros(2))
except Exception as e:  # noqa: BLE001 -- torch may rewrap the type
    assert "2 outputs for 3 ranks" in str(e), e
else:
    raise AssertionError("an all_gather into 2 outputs on 3 ranks returned")

result = rt.run(step, 3)
print(f"ok rank={result.slot} marker={int(marker.item())}", flush=True)
sys.exit(0)
