"""The holdfast package in one process against a real controller: errors
by name, state registration from torch, the communicator on tensors and
the step loop."""

import builtins
import time

import pytest
import torch

import holdfast
from holdfast import errors


def test_error_classes_follow_status_codes():
    assert errors.error_for_code(14) is holdfast.PeerLostError
    assert errors.error_for_code(4) is holdfast.TimeoutError
    assert errors.error_for_code(15) is holdfast.DataLossError
    assert errors.error_for_code(10) is holdfast.AbortedError
    assert errors.error_for_code(3) is holdfast.InvalidArgumentError
    assert errors.error_for_code(9) is holdfast.FencedError
    assert errors.error_for_code(999) is holdfast.HoldfastError
    assert issubclass(holdfast.TimeoutError, builtins.TimeoutError)
    assert issubclass(holdfast.InvalidArgumentError, ValueError)
    assert set(errors.RECOVERABLE) == {
        holdfast.PeerLostError, holdfast.TimeoutError, holdfast.AbortedError}


def test_one_nccl_per_process_is_checked_by_version_and_file():
    """holdfast refuses to start where torch's NCCL is not the one it was
    built against, or where two libnccl files are loaded, naming both."""
    from holdfast import _nccl

    _nccl.check((22809, 22809), (2, 28, 9), ["/x/libnccl.so.2"])  # agrees
    _nccl.check(None)  # a build without the NCCL backend checks nothing
    with pytest.raises(holdfast.FencedError, match=r"2\.29\.3.*2\.28\.9"):
        _nccl.check((22809, 22809), (2, 29, 3), ["/x/libnccl.so.2"])
    with pytest.raises(holdfast.FencedError, match="two NCCL libraries.*/a.*/b"):
        _nccl.check((22809, 22809), (2, 28, 9),
                    ["/a/libnccl.so.2", "/b/libnccl.so.2"])
    # This process: one file, torch's, when the build has the backend.
    libraries = _nccl.loaded_libraries()
    assert len(libraries) <= 1, libraries
    _nccl.check()


def test_tensors_on_the_wrong_side_of_the_communicator_are_named():
    """A CPU tensor for an NCCL communicator, a CUDA one for Gloo (here: a
    tensor of another device type), and a device no backend takes."""
    from holdfast import _tensors
    from holdfast.distributed import _device_of

    with pytest.raises(holdfast.InvalidArgumentError, match="takes CUDA tensors"):
        _tensors.buffer(torch.zeros(2), "x", device_memory=True)
    with pytest.raises(holdfast.InvalidArgumentError, match="takes CPU tensors"):
        _tensors.buffer(torch.zeros(2, device="meta"), "x")

    class Comm:
        def __init__(self, device_memory, backend):
            self.device_memory, self.backend = device_memory, backend

    assert _device_of([torch.zeros(2)], Comm(False, "gloo")) is None
    # CPU tensors on NCCL are staged through the device (_HostStaging).
    assert _device_of([torch.zeros(2)], Comm(True, "nccl")) is None
    with pytest.raises(holdfast.InvalidArgumentError, match="meta tensors"):
        _device_of([torch.zeros(2, device="meta")], Comm(False, "gloo"))
    with pytest.raises(holdfast.InvalidArgumentError, match="several devices"):
        _device_of([torch.zeros(2), torch.zeros(2, device="meta")],
                   Comm(False, "gloo"))


def test_cpu_tensors_of_an_nccl_call_are_staged_and_written_back():
    """A call's CPU tensors on an NCCL communicator: the op takes device
    copies (here CPU clones stand in for them), and only the tensor it
    writes is written back: at once for a collective, at finish() for a
    point-to-point call."""
    from holdfast.runtime import _HostStaging

    meta = torch.zeros(2, device="meta")
    s = _HostStaging("cpu", to_device=lambda t: t.clone())
    assert s.stage(meta) is meta  # a device tensor is taken as it is
    inp, out = torch.ones(3), torch.zeros(3)
    i, o = s.stage(inp), s.stage(out)
    assert i is not inp and o is not out and torch.equal(i, inp)
    o.fill_(5)
    i.fill_(9)  # the op's input copy is never written back
    s.issued(out)
    assert out.tolist() == [5, 5, 5] and inp.tolist() == [1, 1, 1]

    s = _HostStaging("cpu", defer=True, to_device=lambda t: t.clone())
    sent, got = torch.ones(2), torch.zeros(2)
    s.stage(sent).fill_(4)
    s.issued(None)  # a send writes nothing
    s.stage(got).fill_(3)
    s.issued(got)
    assert got.tolist() == [0, 0]  # not yet: the receive may not be done
    s.finish()
    assert got.tolist() == [3, 3] and sent.tolist() == [1, 1]


def test_wrong_token_is_refused(controller):
    address, _ = controller
    with pytest.raises(holdfast.UnauthenticatedError, match="token"):
        holdfast.Runtime(controller=address, token="not-the-token",
                         join_timeout=10)


def test_unknown_option_is_refused(controller):
    address, token = controller
    with pytest.raises(holdfast.InvalidArgumentError, match="no_such_option"):
        holdfast.Runtime(controller=address, token=token, no_such_option=1)


def test_bad_state_is_refused_by_name(controller):
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    with pytest.raises(holdfast.InvalidArgumentError, match="'strided'"):
        rt.register_tensor("strided", torch.zeros(4, 4).t())
    with pytest.raises(holdfast.InvalidArgumentError, match="complex"):
        rt.register_tensor("complex", torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(holdfast.InvalidArgumentError, match="list"):
        rt.register_tensor("notatensor", [1, 2, 3])
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(holdfast.InvalidArgumentError, match="state is empty"):
        rt.register_optimizer(opt)
    rt.register_module(model)
    with pytest.raises(holdfast.InvalidArgumentError, match="model.weight"):
        rt.register_module(model)  # the same names twice
    with pytest.raises(holdfast.NotFoundError, match="nope"):
        rt.shard("nope")


def test_mirror_shard_refuses_what_it_cannot_mirror_by_name(controller):
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    rt.register_sharded_state("w", 8)
    with pytest.raises(holdfast.InvalidArgumentError,
                       match="'nope' is not a sharded array"):
        rt.mirror_shard("nope", torch.zeros(4))
    with pytest.raises(holdfast.InvalidArgumentError,
                       match="needs a CUDA tensor.*partition itself"):
        rt.mirror_shard("w", torch.zeros(4))


class _FakeCudart:
    """cudaHostRegister and cudaGetLastError as _DeviceState._pin calls
    them: records each range, refuses the ones in `refuse`."""

    def __init__(self, refuse=()):
        self.ranges, self.cleared, self.refuse = [], 0, set(refuse)

    def cudaHostRegister(self, ptr, size, flags):
        self.ranges.append((ptr.value, size.value))
        return 712 if ptr.value in self.refuse else 0

    def cudaGetLastError(self):
        self.cleared += 1
        return 0


def test_mirrored_partitions_pin_each_page_once(monkeypatch):
    """Two partitions that share a page: the second pins only its own
    pages (CUDA refuses a page registered twice); a refusal is counted and
    cleared from CUDA's last error, which torch's next launch check would
    otherwise raise."""
    import mmap
    from holdfast import runtime as hr
    page = mmap.PAGESIZE
    fake = _FakeCudart()
    monkeypatch.setattr(hr, "_loaded_cudart", lambda: fake)
    memory = torch.zeros(4 * page, dtype=torch.uint8)
    base = -(-memory.data_ptr() // page) * page - memory.data_ptr()
    state = hr._DeviceState()
    first = memory[base:base + page + 100]  # pages 0 and 1
    second = memory[base + page + 100:base + 3 * page]  # pages 1 and 2
    assert state._pin(first) and state._pin(second)
    start = memory.data_ptr() + base
    assert fake.ranges == [(start, 2 * page), (start + 2 * page, page)]
    assert state._pin(first)  # all pinned already: nothing to do
    assert len(fake.ranges) == 2
    refused = _FakeCudart(refuse={start + 3 * page})
    monkeypatch.setattr(hr, "_loaded_cudart", lambda: refused)
    third = memory[base + 3 * page:base + 3 * page + 10]
    assert not state._pin(third)
    assert refused.cleared == 1


def test_step_loop_restores_nothing_and_runs(controller):
    """One slot: steps run in order, the communicator works on tensors and
    refuses bad ones, and the registered state is what the loop left."""
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    weights = torch.zeros(8)
    rt.register_tensor("weights", weights)
    shard = rt.register_sharded_state("moments", 10, torch.float64)
    assert shard.numel() == 10 and shard.holdfast_offset == 0
    seen = []

    def step(ctx):
        seen.append(ctx.step)
        assert ctx.world_size == 1 and ctx.slot == 0 and ctx.rank == 0
        t = torch.full((8,), float(ctx.step))
        ctx.comm.all_reduce(t)
        weights.add_(t)
        out = torch.empty(8)
        ctx.comm.all_gather(out, t)
        assert torch.equal(out, t)
        with pytest.raises(holdfast.InvalidArgumentError, match="elements"):
            ctx.comm.all_gather(torch.empty(3), t)
        with pytest.raises(holdfast.InvalidArgumentError, match="contiguous"):
            ctx.comm.all_reduce(torch.zeros(4, 4).t())
        with pytest.raises(holdfast.InvalidArgumentError, match="reduce op"):
            ctx.comm.all_reduce(t, op="median")
        ctx.runtime.shard("moments", torch.float64).add_(1.0)

    restores = []
    result = rt.run(step, 5, on_restore=lambda s: restores.append((s, list(seen))))
    assert restores == [(0, [])]
    assert seen == [1, 2, 3, 4, 5]
    assert result.final_step == 5 and result.world_size == 1
    assert result.recoveries == []
    assert torch.equal(weights, torch.full((8,), 15.0))
    assert torch.equal(rt.shard("moments", torch.float64),
                       torch.full((10,), 5.0, dtype=torch.float64))


def counter_runtime(controller, n, **options):
    """A runtime of the `controller` fixture's job with an int64 tensor of
    `n` zeros registered as "counter"."""
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token, **options)
    counter = torch.zeros(n, dtype=torch.int64)
    rt.register_tensor("counter", counter)
    return rt, counter


def test_overlapped_snapshot_copies_commit_once_fenced(controller):
    """run()'s default snapshot_copy="auto": a step that calls
    begin_state_update() has its snapshot copied while the next step runs,
    and it commits once that step calls it too."""
    rt, counter = counter_runtime(controller, 1024, verify_backups="restore")

    def step(ctx):
        assert int(counter[0]) == ctx.step - 1  # reads may overlap the copy
        time.sleep(0.01)  # compute: the backup thread copies meanwhile
        ctx.runtime.begin_state_update()
        counter.fill_(ctx.step)

    result = rt.run(step, 20)
    assert result.final_step == 20
    assert rt.committed_step == 20
    # Deferred snapshots committed, not only the first and the last.
    assert result.backups > 2
    assert result.snapshots_overlapped > 2
    assert result.snapshots_unfenced == 0


def test_auto_snapshot_copy_drops_a_snapshot_the_next_step_did_not_fence(
        controller):
    """A step function that fences only on even steps: each even step's
    snapshot, copied during the odd step after it, is dropped and never
    commits, and the run goes on."""
    rt, counter = counter_runtime(controller, 64)
    committed_at_start = []

    def step(ctx):
        committed_at_start.append(rt.committed_step)
        time.sleep(0.01)
        if ctx.step % 2 == 0:
            ctx.runtime.begin_state_update()
        counter.fill_(ctx.step)

    result = rt.run(step, 20)
    assert result.final_step == 20
    assert rt.committed_step == 20
    assert result.snapshots_unfenced > 0
    # Even steps' snapshots were copied during the odd step after them and
    # dropped; none of them ever committed (the last, 20, was copied
    # between the steps).
    assert all(c % 2 == 1 or c == 0 for c in committed_at_start)


def test_between_steps_snapshot_copy_never_defers(controller):
    rt, counter = counter_runtime(controller, 64)

    def step(ctx):
        time.sleep(0.005)
        ctx.runtime.begin_state_update()  # returns at once
        counter.fill_(ctx.step)

    result = rt.run(step, 10, snapshot_copy="between_steps")
    assert rt.committed_step == 10
    assert result.snapshots_overlapped == 0
    assert result.backups > 2
    with pytest.raises(ValueError, match="'sometimes'"):
        rt.run(step, 10, snapshot_copy="sometimes")


def test_an_overlapped_step_without_the_fence_ends_the_run(controller):
    rt, counter = counter_runtime(controller, 4)

    def unfenced(ctx):
        time.sleep(0.02)
        counter[0] = ctx.step

    with pytest.raises(holdfast.FencedError, match="begin_state_update"):
        rt.run(unfenced, 20, snapshot_copy="during_next_step")


def test_a_write_before_the_fence_counts_as_no_fence(controller):
    """A step that writes a registered tensor in place and only then calls
    begin_state_update(): the snapshot copied during it may be torn, so it
    is dropped, and the ones after it are copied between the steps."""
    rt, counter = counter_runtime(controller, 1024, verify_backups="restore")

    def step(ctx):
        time.sleep(0.01)  # compute: the backup thread copies meanwhile
        counter.fill_(ctx.step)  # too early
        ctx.runtime.begin_state_update()

    result = rt.run(step, 20)
    assert result.final_step == 20
    assert rt.committed_step == 20
    # Step 1 had nothing to compare with, so its snapshot was copied during
    # step 2, which wrote first: that one was dropped. No step after it
    # counted as fenced, so no snapshot was copied during a step again.
    assert result.snapshots_unfenced == 1
    assert result.snapshots_overlapped == 0
    assert result.backups > 2


def test_an_optimizer_step_before_the_fence_is_named(controller):
    """With every snapshot copied during the next step, a write before the
    fence ends the run, naming the first tensor written: a parameter that
    the optimizer updated (registered through its state_dict)."""
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rt.register_module(model)

    def step(ctx):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        ctx.runtime.begin_state_update()
        opt.zero_grad()

    with pytest.raises(holdfast.FencedError,
                       match=r"step 2 wrote registered state \(tensor "
                             r"'model.weight'\) before"):
        rt.run(step, 10, snapshot_copy="during_next_step")


def test_a_bad_verify_backups_is_refused(controller):
    address, token = controller
    with pytest.raises(holdfast.InvalidArgumentError, match="'sometimes'"):
        holdfast.Runtime(controller=address, token=token,
                         verify_backups="sometimes")


def test_a_foreign_exception_ends_the_run_and_is_raised(controller):
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    rt.register_tensor("w", torch.zeros(2))

    def step(ctx):
        if ctx.step == 3:
            raise KeyError("boom at step 3")

    with pytest.raises(KeyError, match="boom at step 3"):
        rt.run(step, 10)


def test_a_holdfast_error_that_cannot_be_recovered_is_raised(controller):
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    rt.register_tensor("w", torch.zeros(2))

    def step(ctx):
        raise holdfast.DataLossError("shard 7 is gone")

    with pytest.raises(holdfast.DataLossError, match="shard 7 is gone"):
        rt.run(step, 4)


def test_a_kept_communicator_keeps_its_runtime_alive(controller):
    import gc
    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    rt.register_tensor("w", torch.zeros(2))
    comm = rt.communicator()
    del rt
    holdfast.runtime._current = None  # the module's own reference
    gc.collect()
    t = torch.ones(3)
    comm.all_reduce(t)  # the runtime (and its communicator) still exist
    assert torch.equal(t, torch.ones(3))
    assert comm.size == 1 and comm.generation == 0


def test_dcp_round_trip_and_refusals_by_name(controller, tmp_path):
    """One slot: run() writes DCP checkpoints of replicated and sharded
    state that plain torch reads, load() reads one back into the registered
    state and returns its step, a step outside 0..steps is refused, and a
    checkpoint lacking a registered name, or holding it with another shape,
    is refused naming it."""
    import torch.distributed.checkpoint as dcp

    import holdfast.dcp

    address, token = controller
    rt = holdfast.Runtime(controller=address, token=token)
    weights = torch.zeros(4)
    rt.register_tensor("weights", weights)
    shard = rt.register_sharded_state("moments", 6, torch.float64)

    def step(ctx):
        ctx.runtime.begin_state_update()
        weights.add_(ctx.step)
        rt.shard("moments", torch.float64).add_(0.5)

    with pytest.raises(holdfast.InvalidArgumentError, match="start_step is 9"):
        rt.run(step, 5, start_step=9)
    with pytest.raises(holdfast.InvalidArgumentError, match="dcp_every"):
        rt.run(step, 5, dcp_every=2)
    root = str(tmp_path / "dcp")
    result = rt.run(step, 5, dcp_dir=root, dcp_every=2, dcp_keep=2)
    assert result.final_step == 5
    # Steps 2, 4 and the last (5); the newest two are kept.
    assert holdfast.dcp.steps_in(root) == [4, 5]
    plain = {"weights": torch.empty(4), "moments": torch.empty(6, dtype=torch.float64),
             "holdfast.step": torch.zeros(1, dtype=torch.int64)}
    dcp.load(plain, checkpoint_id=f"{root}/step-4", no_dist=True)
    assert torch.equal(plain["weights"], torch.full((4,), 10.0))  # 1+2+3+4
    assert torch.equal(plain["moments"], torch.full((6,), 2.0, dtype=torch.float64))
    assert int(plain["holdfast.step"][0]) == 4

    weights.zero_()
    shard.zero_()
    assert holdfast.dcp.load(rt, f"{root}/step-4") == 4
    assert torch.equal(weights, torch.full((4,), 10.0))
    assert torch.equal(shard, torch.full((6,), 2.0, dtype=torch.float64))

    lacking = str(tmp_path / "lacking")
    dcp.save({"weights": torch.ones(4)}, checkpoint_id=lacking, no_dist=True)
    with pytest.raises(holdfast.InvalidArgumentError, match="no tensor 'moments'"):
        holdfast.dcp.load(rt, lacking)
    other = str(tmp_path / "other")
    dcp.save({"weights": torch.ones(5), "moments": torch.ones(6, dtype=torch.float64)},
             checkpoint_id=other, no_dist=True)
    with pytest.raises(holdfast.InvalidArgumentError, match="'weights' in .* is"):
        holdfast.dcp.load(rt, other)
    with pytest.raises(holdfast.InvalidArgumentError, match="not a DCP checkpoint"):
        holdfast.dcp.load(rt, str(tmp_path))
