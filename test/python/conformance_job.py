"""Run by test_conformance.py under holdfast-run -n N (N = 3 or 4): every
call of torch.distributed's collective API, first on a plain "gloo" group
(through a FileStore) and then on the "holdfast" group, in the same
processes; the answers are compared bit for bit.

The inputs are small integers in every dtype, so every sum, product,
minimum and maximum is exact whatever order the operands meet in: the
comparison checks what each call computes and where it puts it, not the
rounding of one summation order (holdfast's own order is checked by the
jobs that compare final hashes).

HOLDFAST_CONFORMANCE_DEVICE=cuda runs the holdfast group's calls on CUDA
tensors (NCCL; HOLDFAST_DEVICE names the GPU) against gloo's answers on
the CPU.

Prints one line per case, `case NAME ok`, `case NAME both-refuse`,
`case NAME holdfast-only`, `case NAME unsupported: ERROR` (gloo answers,
holdfast refuses) or `case NAME MISMATCH: ...`, then
`conformance rank=R cases=K mismatches=M`."""

import datetime
import os
import pathlib
import re
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import holdfast
import holdfast.distributed as hd

DEVICE = os.environ.get("HOLDFAST_CONFORMANCE_DEVICE", "cpu")
if DEVICE == "cuda":
    INDEX = int(os.environ.get("HOLDFAST_DEVICE", "0"))
    torch.cuda.set_device(INDEX)
    rt = holdfast.Runtime(connect_timeout=120, backend="nccl", device=INDEX)
else:
    rt = holdfast.Runtime(connect_timeout=120)
R, N = rt.slot, rt.world_size

INT_DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def values(seed, shape, dtype, rank=None):
    """Small integers (exact in every dtype, products of N of them too),
    different on every rank and in every case."""
    g = torch.Generator().manual_seed(seed * 101 + (R if rank is None else rank))
    here = torch.get_default_device()
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, device="cpu").bool().to(here)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=g, device="cpu").to(dtype).to(here)


CASES = []


def case(name, needs=3, expect=None):
    """A call, run on both groups. `expect`: what it must give, where
    gloo's answer is not the oracle (gloo reduces a strided view's
    memory as if it were contiguous, and changes elements outside it)."""
    def add(fn):
        CASES.append((name, fn, needs, expect))
        return fn
    return add


def _bool_expect(seed, fold):
    """gloo adds bools as bytes (a sum of three trues is the byte 3, not a
    bool); the answer is a logical or (sum, max) or and (product, min)."""
    def expect():
        return [fold(torch.stack([values(seed, (5, 3), torch.bool, rank=k)
                                  for k in range(N)]), dim=0)]
    return expect


for dt in INT_DTYPES + FLOAT_DTYPES + [torch.bool]:
    for op_name, op in OPS.items():
        seed = len(CASES)

        def all_reduce(dt=dt, op=op, seed=seed):
            t = values(seed, (5, 3), dt)
            dist.all_reduce(t, op=op)
            return [t]
        expect = None
        if dt == torch.bool:
            expect = _bool_expect(seed, torch.any if op_name in ("sum", "max")
                                  else torch.all)
        case(f"all_reduce {op_name} {str(dt)[6:]}", expect=expect)(all_reduce)


def _avg():
    return [sum(values(1, (4,), torch.float32, rank=k) * N for k in range(N)) / N]


@case("all_reduce avg float32", expect=_avg)
def _():
    t = values(1, (4,), torch.float32) * N
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return [t]


def _view_sum():
    base = values(2, (4, 3), torch.float32)
    base[:, 1] = sum(values(2, (4, 3), torch.float32, rank=k)[:, 1]
                     for k in range(N))
    return [base]


@case("all_reduce of a strided view", expect=_view_sum)
def _():
    base = values(2, (4, 3), torch.float32)
    dist.all_reduce(base[:, 1])
    return [base]


@case("all_reduce complex64")
def _():
    t = torch.complex(values(3, (3,), torch.float32), values(4, (3,), torch.float32))
    dist.all_reduce(t)
    return [t]


@case("all_reduce int16")
def _():
    t = values(5, (3,), torch.int16)
    dist.all_reduce(t)
    return [t]


@case("broadcast")
def _():
    out = []
    for src in range(N):
        t = values(6 + src, (2, 3), torch.int64)
        dist.broadcast(t, src=src)
        out.append(t)
    return out


def _view_from_1():
    t = values(9, (3, 4), torch.float64)
    t[:, 2] = values(9, (3, 4), torch.float64, rank=1)[:, 2]
    return [t]


@case("broadcast of a strided view", expect=_view_from_1)
def _():
    t = values(9, (3, 4), torch.float64)
    dist.broadcast(t[:, 2], src=1)
    return [t]


@case("reduce")
def _():
    out = []
    for dst, op in ((1, dist.ReduceOp.SUM), (N - 1, dist.ReduceOp.MAX),
                    (0, dist.ReduceOp.PRODUCT)):
        t = values(10 + dst, (6,), torch.float32)
        dist.reduce(t, dst=dst, op=op)
        # Only the destination's result is defined.
        out.append(t if R == dst else torch.zeros(0))
    return out


@case("all_gather")
def _():
    parts = [torch.empty(2, 2, dtype=torch.int32) for _ in range(N)]
    dist.all_gather(parts, values(12, (2, 2), torch.int32))
    return parts


@case("all_gather uneven sizes")
def _():
    parts = [torch.empty(k + 1) for k in range(N)]
    dist.all_gather(parts, values(13, (R + 1,), torch.float32))
    return parts


@case("all_gather_into_tensor")
def _():
    out = torch.empty(N * 3, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, values(14, (3,), torch.bfloat16))
    return [out]


@case("all_gather_object")
def _():
    got = [None] * N
    dist.all_gather_object(got, {"rank": R, "word": "x" * (R + 1)})
    return [torch.tensor([len(repr(got))]), torch.frombuffer(
        bytearray(repr(got).encode()), dtype=torch.uint8)]


@case("broadcast_object_list")
def _():
    objs = [R, f"from {R}", None] if R == 1 else [None, None, None]
    dist.broadcast_object_list(objs, src=1)
    return [torch.frombuffer(bytearray(repr(objs).encode()), dtype=torch.uint8)]


@case("gather")
def _():
    dst = N - 1
    outs = [torch.empty(4, dtype=torch.int64) for _ in range(N)] if R == dst else None
    dist.gather(values(15, (4,), torch.int64), outs, dst=dst)
    return outs or []


@case("gather_object")
def _():
    outs = [None] * N if R == 0 else None
    dist.gather_object(("r", R), outs, dst=0)
    return [torch.frombuffer(bytearray(repr(outs).encode()), dtype=torch.uint8)]


@case("scatter")
def _():
    src = 1
    out = torch.empty(3, dtype=torch.float16)
    ins = [values(16 + k, (3,), torch.float16, rank=src) for k in range(N)]
    dist.scatter(out, ins if R == src else None, src=src)
    return [out]


@case("scatter_object_list")
def _():
    got = [None]
    dist.scatter_object_list(got, [f"to {k}" for k in range(N)] if R == 0 else None,
                             src=0)
    return [torch.frombuffer(bytearray(repr(got).encode()), dtype=torch.uint8)]


@case("reduce_scatter")
def _():
    out = torch.empty(2, 2)
    dist.reduce_scatter(out, [values(20 + k, (2, 2), torch.float32)
                              for k in range(N)])
    return [out]


@case("reduce_scatter_tensor")
def _():
    out = torch.empty(3, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, values(21, (N * 3,), torch.int32),
                               op=dist.ReduceOp.MAX)
    return [out]


@case("all_to_all_single even")
def _():
    out = torch.empty(N * 2, dtype=torch.int64)
    dist.all_to_all_single(out, values(22, (N * 2,), torch.int64))
    return [out]


@case("all_to_all_single uneven")
def _():
    # Rank r sends (r + k) % 3 + 1 rows of 2 to rank k.
    send = [(R + k) % 3 + 1 for k in range(N)]
    recv = [(k + R) % 3 + 1 for k in range(N)]
    inp = values(23, (sum(send), 2), torch.float32)
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=recv,
                           input_split_sizes=send)
    return [out]


def _all_to_all():
    return [values(24 + R, (R + k + 1,), torch.float64, rank=k) for k in range(N)]


@case("all_to_all", expect=_all_to_all)
def _():
    ins = [values(24 + k, (k + R + 1,), torch.float64) for k in range(N)]
    outs = [torch.empty(R + k + 1, dtype=torch.float64) for k in range(N)]
    dist.all_to_all(outs, ins)
    return outs


@case("all_reduce_coalesced")
def _():
    ts = [values(25, (3,), torch.float32), values(26, (2, 2), torch.float32)]
    dist.all_reduce_coalesced(ts)
    return ts


@case("coalescing_manager all_reduce")
def _():
    ts = [values(27 + k, (k + 2,), torch.float32) for k in range(3)]
    with c10d._coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    return ts


@case("coalescing_manager all_gather_into_tensor")
def _():
    ins = [values(30 + k, (k + 1,), torch.int32) for k in range(2)]
    outs = [torch.empty(N * (k + 1), dtype=torch.int32) for k in range(2)]
    with c10d._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    return outs


@case("coalescing_manager reduce_scatter_tensor")
def _():
    ins = [values(32 + k, (N * (k + 1),), torch.float32) for k in range(2)]
    outs = [torch.empty(k + 1) for k in range(2)]
    with c10d._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    return outs


@case("barrier")
def _():
    dist.barrier()
    return []


@case("monitored_barrier")
def _():
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    return []


@case("send and recv")
def _():
    if R == 0:
        dist.send(values(34, (3,), torch.float32), dst=2)
        return []
    if R == 2:
        t = torch.empty(3)
        dist.recv(t, src=0)
        return [t]
    return []


@case("isend and irecv, a ring")
def _():
    out = torch.empty(4, dtype=torch.int64)
    works = [dist.isend(values(35, (4,), torch.int64), dst=(R + 1) % N),
             dist.irecv(out, src=(R - 1) % N)]
    for w in works:
        w.wait()
    return [out]


@case("batch_isend_irecv, a ring both ways")
def _():
    left, right = torch.empty(3), torch.empty(3)
    ops = [dist.P2POp(dist.isend, values(36, (3,), torch.float32), (R + 1) % N),
           dist.P2POp(dist.isend, values(37, (3,), torch.float32), (R - 1) % N),
           dist.P2POp(dist.irecv, left, (R - 1) % N),
           dist.P2POp(dist.irecv, right, (R + 1) % N)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return [left, right]


@case("irecv from any source")
def _():
    if R == 1:
        dist.send(values(38, (2,), torch.float32), dst=0)
    if R == 0:
        t = torch.empty(2)
        try:
            dist.irecv(t).wait()
        except Exception:
            dist.recv(t, src=1)  # rank 1's send waits for a receive
            raise
        return [t]
    return []


def _subgroup_ranks():
    return [[0, 1], [1, N - 1]]


@case("new_group all_reduce and broadcast")
def _():
    out = []
    for ranks in _subgroup_ranks():
        g = dist.new_group(ranks)
        if R in ranks:
            t = values(40, (3,), torch.float32)
            dist.all_reduce(t, group=g)
            b = values(41, (2,), torch.int64)
            dist.broadcast(b, group=g, group_src=1)
            out += [t, b]
    return out


@case("new_group all the rest")
def _():
    ranks = list(range(1, N))
    g = dist.new_group(ranks)
    if R not in ranks:
        return []
    n = len(ranks)
    parts = [torch.empty(2) for _ in range(n)]
    dist.all_gather(parts, values(42, (2,), torch.float32), group=g)
    red = torch.empty(2)
    dist.reduce_scatter_tensor(red, values(43, (2 * n,), torch.float32), group=g)
    a2a = torch.empty(n, dtype=torch.int32)
    dist.all_to_all_single(a2a, values(44, (n,), torch.int32), group=g)
    r = values(45, (3,), torch.float32)
    dist.reduce(r, group=g, group_dst=0)
    dist.barrier(group=g)
    ring = torch.empty(2)
    me = g.rank()
    for w in dist.batch_isend_irecv([
            dist.P2POp(dist.isend, values(46, (2,), torch.float32),
                       group=g, group_peer=(me + 1) % n),
            dist.P2POp(dist.irecv, ring, group=g, group_peer=(me - 1) % n)]):
        w.wait()
    return parts + [red, a2a, ring] + ([r] if me == 0 else [])


def _split_ranks():
    return [list(range(0, N // 2)), list(range(N // 2, N))]


def _split_sum():
    mine = next(g for g in _split_ranks() if R in g)
    return [sum(values(48, (3,), torch.float32, rank=k) for k in mine)]


# gloo cannot split (torch's split_group wants a backend that can).
@case("split_group", expect=_split_sum)
def _():
    g = dist.split_group(split_ranks=_split_ranks())
    t = values(48, (3,), torch.float32)
    dist.all_reduce(t, group=g)
    return [t]


@case("init_device_mesh 2-D", needs=4)
def _():
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(torch.get_default_device().type, (2, N // 2),
                            mesh_dim_names=("dp", "tp"))
    out = []
    for dim in ("dp", "tp"):
        t = values(47, (3,), torch.float32)
        dist.all_reduce(t, group=mesh.get_group(dim))
        out.append(t)
    out.append(torch.tensor(mesh.get_coordinate()))
    return out


def run_cases(only=None):
    results = {}
    for name, fn, needs, _ in CASES:
        if N < needs or (only is not None and name != only):
            continue
        try:
            results[name] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 -- the error is the answer
            results[name] = ("error", f"{type(e).__name__}: {e}".splitlines()[0])
    return results


def agree(a, b):
    return len(a) == len(b) and all(same(x.cpu(), y.cpu()) for x, y in zip(a, b))


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    return torch.equal(a.contiguous().view(torch.uint8),
                       b.contiguous().view(torch.uint8))


def main():
    job = re.sub(r"[^0-9A-Za-z]", "_", os.environ.get("HOLDFAST_CONTROLLER", ""))
    path = pathlib.Path(tempfile.gettempdir()) / f"holdfast-conformance-{job}"
    store = dist.FileStore(str(path), N)
    dist.init_process_group("gloo", store=store, rank=R, world_size=N)
    reference = run_cases()
    dist.destroy_process_group()

    hd.init_process_group(rt)
    if DEVICE == "cuda":
        torch.set_default_device(torch.device("cuda", INDEX))
    got = run_cases()
    # torch's split_group needs a default group bound to a device, and
    # init_process_group binds accelerators only (a CUDA job passes
    # device_id): on CPU it is refused for every backend. Bound by hand
    # (torch's new_group then refuses the CPU binding), the holdfast
    # group splits.
    dist.distributed_c10d._get_default_group().bound_device_id = (
        torch.device("cuda", INDEX) if DEVICE == "cuda" else torch.device("cpu", 0))
    got.update(run_cases(only="split_group"))

    mismatches = 0
    expects = {name: expect for name, _, _, expect in CASES}
    for name, (kind, want) in reference.items():
        have_kind, have = got[name]
        gloo_says = "gloo refuses" if kind == "error" else "gloo agrees"
        if expects[name] is not None:
            right = expects[name]()
            if kind != "error" and not agree(right, want):
                gloo_says = "gloo is wrong"
            want, kind = right, "ok"
        if kind == "error" and have_kind == "error":
            verdict = f"both-refuse: gloo {want}; holdfast {have}"
        elif kind == "error":
            verdict = "holdfast-only"
        elif have_kind == "error":
            verdict = f"unsupported: {have}"
        elif agree(want, have):
            verdict = "ok" if expects[name] is None else f"ok ({gloo_says})"
        else:
            mismatches += 1
            verdict = (f"MISMATCH: want {want} holdfast {have}; bytes: want "
                       f"{[t.contiguous().view(torch.uint8).tolist() for t in want]}"
                       f" holdfast "
                       f"{[t.contiguous().view(torch.uint8).tolist() for t in have]}")
        print(f"case {name} {verdict}", flush=True)
    print(f"conformance rank={R} cases={len(reference)} mismatches={mismatches}",
          flush=True)
    if R == 0:
        path.unlink(missing_ok=True)
    rt.leave(finished=True)
    return 0


sys.exit(main())
