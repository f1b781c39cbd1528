"""torch.distributed on holdfast: a process group named "holdfast".

    import holdfast, holdfast.distributed as hd
    rt = holdfast.Runtime()
    pg = hd.init_process_group(rt)        # dist.init_process_group("holdfast")
    def step(ctx):
        ddp = hd.ddp(rt, model)           # rebuilt once per generation
        ...forward, backward, optimizer.step()...
    rt.run(step, steps)

The process group stays valid across generations: each operation runs on
the runtime's current communicator. Operations are asynchronous: each
returns a Work at once and runs on the runtime's operation thread, in the
order issued, so DDP's all-reduces overlap its backward pass. A holdfast failure inside a step does
not raise out of the operation (DDP's reducer would be left half done):
the operation completes locally, later ones in the same step are skipped,
and the error is raised when the step function returns, so the runtime
rolls the step back and recovers. Outside a step, failures raise at once.

C++ code sees the rank and size a group was built with (Python callers see
the live ones), so after a shrink ddp() builds DDP on a holdfast group of
the new size. DDP itself is rebuilt once per generation (`ddp()`): every member of a new
generation, a promoted standby included, then starts from a fresh reducer
at the same step, and its construction-time checks run on the new group.
"""

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import _groupcomm
from . import runtime as _runtime
from ._tensors import check_contiguous, check_dtype
from .errors import FencedError, HoldfastError, InvalidArgumentError

BACKEND = "holdfast"


def _op_name(reduce_op):
    for name in ("SUM", "MIN", "MAX", "PRODUCT", "AVG"):
        if hasattr(dist.ReduceOp, name) and reduce_op == getattr(
            dist.ReduceOp, name
        ):
            return "average" if name == "AVG" else name.lower()
    raise InvalidArgumentError(f"holdfast: reduce op {reduce_op} is not supported")


class ProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group over a holdfast Runtime."""

    def __init__(self, runtime, rank=None, size=None, ranks=None):
        """`ranks`: the world slots of a subgroup, in group rank order (see
        _groupcomm); None for the world."""
        if runtime is None:
            raise InvalidArgumentError(
                "holdfast process group: create a holdfast.Runtime first"
            )
        super().__init__(
            max(runtime.slot, 0) if rank is None else rank,
            max(runtime.world_size, 1) if size is None else size,
        )
        self._rt = runtime
        self._error = None
        self._ranks = None if ranks is None else [int(r) for r in ranks]
        self._tag = None if ranks is None else _groupcomm.group_tag(self._ranks)
        runtime._groups.append(self)

    # The slot and world size of the running step, else the live ones
    # (torch's own copies are fixed at construction; Python callers see
    # these). Within a step they stay the step's even when a failure opens
    # a generation of another size meanwhile: FSDP computes its buffers'
    # shapes from them while the step's remaining operations are skipped.
    # A subgroup's are its own, fixed: its members keep their slots.
    def rank(self):
        slot = (self._rt._step_place[0] if self._rt.in_step
                else max(self._rt.slot, 0))
        if self._ranks is not None:
            return self._ranks.index(slot) if slot in self._ranks else -1
        return slot

    def size(self):
        if self._ranks is not None:
            return len(self._ranks)
        if self._rt.in_step:
            return self._rt._step_place[1]
        return max(self._rt.world_size, 1)

    def getBackendName(self):
        return BACKEND

    # The group's name (torch 2.x's DeviceMesh and group registry read it).
    # torch stores it in the group's C++ backends, which a Python group
    # has none of; it is kept here instead.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", None) or f"holdfast:{id(self)}"

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", None) or "holdfast"

    def _get_backend_name(self):
        return BACKEND

    # ---- error deferral inside steps --------------------------------------
    def _begin_step(self):
        self._error = None

    def _end_step(self):
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self, fn, result, tensors, p2p=False):
        """Issues `fn(communicator)` on the runtime's operation thread and
        returns its Work at once; the Work completes with `result` when
        the operation ended. `tensors`: every tensor the call touches; CUDA
        tensors make it a device operation (see _run_device)."""
        if self._rt.standby:
            raise FencedError(
                "holdfast process group: a standby has no communicator until "
                "run() gives it a slot; issue collectives inside the step "
                "function"
            )
        in_step = self._rt.in_step
        try:
            comm_c = self._communicator(in_step)
            device = _device_of(tensors, comm_c)
        except HoldfastError as e:
            # Bad arguments are refused at the call. The step's
            # communicator replaced (a new generation opened): the step
            # fails at its end, as if the op had.
            if isinstance(e, InvalidArgumentError) or not self._defer(
                    e, in_step):
                raise
            fut = torch.futures.Future()
            fut.set_result(result)
            return self._work(fut, in_step)
        if device is not None:
            return self._run_device(fn, result, comm_c, device, p2p)
        if tensors and comm_c.device_memory:
            # CPU tensors on an NCCL communicator (torch's object
            # collectives, a CPU model's call in a GPU job): staged through
            # the current device, in the one order of the communicator.
            return self._run_device(fn, result, comm_c,
                                    torch.device("cuda",
                                                 torch.cuda.current_device()),
                                    p2p, host=True)
        fut = torch.futures.Future()
        self._rt._ops.submit(self._task(fn, fut, result, comm_c, in_step))
        return _P2PWork(fut) if p2p else self._work(fut, in_step)

    def _task(self, fn, fut, result, comm_c, in_step):
        """The operation thread's task for _run: fn(communicator), then
        `fut` completes with `result`, or fails (see _defer). An fn that
        returns posted point-to-point operations leaves their wait to
        the runtime's second thread, so the operation thread goes on
        while the peer takes them (see _OpQueue)."""

        def task():
            if self._error is not None:  # the step already failed: skip
                fut.set_result(result)
                return
            try:
                posted = fn(self._group_comm(_runtime.Communicator(comm_c)))
            except Exception as e:  # noqa: BLE001 -- see _defer
                if not self._defer(e, in_step):
                    fut.set_exception(e)
                    return
                posted = None
            if posted:
                self._rt._ops.wait_later(lambda: self._complete(
                    fut, result, in_step, lambda: _groupcomm.wait_all(posted)))
                return
            fut.set_result(result)

        return task

    def _complete(self, fut, result, in_step, wait):
        """Completes `fut` with `result` once wait() returned (on the
        runtime's second thread); its error fails `fut` (see _defer)."""
        try:
            wait()
        except Exception as e:  # noqa: BLE001 -- see _defer
            if not self._defer(e, in_step):
                _fail(fut, e)
                return
        fut.set_result(result)

    def _group_comm(self, world):
        """The communicator this group's calls run on: `world` (a runtime
        Communicator of the step's generation), or a subgroup's on it."""
        if self._ranks is None:
            return world
        return _groupcomm.SubComm(world, self._ranks, self._tag)

    @staticmethod
    def _work(fut, in_step):
        """A C++ Work around the future: a Python subclass of Work would
        lose its overrides once Python drops its reference, while C++
        (DDP's reducer) still waits on it. Such a Work's wait() does not
        raise the future's error, so outside a step the call waits here
        and raises it (inside one, errors go to the step's end)."""
        work = _c10d._create_work_from_future(fut)
        if not in_step:
            fut.wait()
        return work

    def _communicator(self, in_step):
        """The communicator an op issued now runs on. Inside a step, the
        step's own, also once a newer generation opened (its ops then fail
        with AbortedError and the step is redone after a recovery):
        building the new generation's communicator from a step would put
        this slot in it while the others (a standby restoring) are not.
        Outside a step, the current generation's (built if needed)."""
        if in_step:
            comm_c = self._rt._step_comm
            comm_c.rank  # AbortedError once its generation was replaced
            return comm_c
        return self._rt._rt.communicator()

    def _defer(self, error, in_step):
        """Whether an operation's error is kept for the step's end (True)
        rather than failing its Work. Inside a step every error is: a lost
        peer, a timeout or a failed op is for the runtime to judge there,
        and failing DDP's reducer would leave it in the middle of an
        iteration; any other error fails the step there (a Work's wait()
        would not raise it). Outside a step the call raises it."""
        if not in_step:
            return False
        self._error = self._error or error
        return True

    def _run_device(self, fn, result, comm_c, device, p2p=False, host=False):
        """_run for CUDA tensors on an NCCL communicator, with
        ProcessGroupNCCL's stream semantics: the operation starts on the
        device after the work queued so far on the caller's current
        stream (an event recorded here, at issue); its Work and future
        complete once it is queued on the communicator's stream, and
        waiting on them makes the waiter's current stream wait for it
        (a CUDA-aware future), with no host synchronisation. The operation
        thread then waits for the device to finish it, so a failure still
        reaches the step's end, and the step's end waits for every
        operation it issued (drain). Outside a step a call completes only
        once done on the device, so its error fails the Work.

        A point-to-point call (`p2p`) is waited for on the runtime's
        second thread, which completes its Work once it is done on the
        device, inside a step or not: the operation thread goes on, so a
        ring of them meets.

        `host`: the call's tensors are CPU tensors, staged through `device`
        (runtime._HostStaging); its Work completes once they hold the
        result, as a CPU tensor's would."""
        fut = torch.futures.Future(devices=[] if host else [device])
        in_step = self._rt.in_step
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))

        def finish_later(issuer):
            def wait():
                with torch.cuda.device(device):
                    self._complete(fut, result, in_step, issuer.finish)
            self._rt._ops.wait_later(wait)

        def task():
            with torch.cuda.device(device):
                try:
                    issuer = _runtime._DeviceIssuer(
                        comm_c, device, ready,
                        _runtime._HostStaging(device, defer=p2p)
                        if host else None)
                    comm = self._group_comm(
                        _runtime.Communicator(comm_c, issuer=issuer))
                    with torch.cuda.stream(issuer.main):
                        if self._error is None:  # else the step failed: skip
                            fn(comm)
                        if p2p:
                            finish_later(issuer)
                            return
                        if not in_step or host:
                            issuer.finish()
                        # The future records its events on the current
                        # stream: the communicator's, after the operation.
                        fut.set_result(result)
                    if in_step and not host:
                        issuer.finish()
                except Exception as e:  # noqa: BLE001 -- see _defer
                    if not self._defer(e, in_step):
                        _fail(fut, e)
                    elif not fut.done():
                        fut.set_result(result)

        self._rt._ops.submit(task)
        return _P2PWork(fut) if p2p else self._work(fut, in_step)

    # ---- collectives -------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp) if opts is not None else "sum"

        def fn(comm):
            for t in tensors:
                _in_place(t, lambda w: _all_reduce(comm, w, op))

        return self._run(fn, tensors, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """One all-reduce of every tensor's elements, in the order given."""
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        _same_dtype("all_reduce_coalesced", tensors)

        def fn(comm):
            flat = torch.cat([t.reshape(-1) for t in tensors])
            _all_reduce(comm, flat, op)
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()

        return self._run(fn, tensors, tensors)

    def reduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        root = opts.rootRank if opts is not None else 0

        def fn(comm):
            for t in tensors:
                _groupcomm.reduce(comm, t, op, root)

        return self._run(fn, tensors, tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0

        def fn(comm):
            for i, inp in enumerate(input_tensors):
                outs = output_tensors[i] if output_tensors else []
                _groupcomm.gather(comm, outs, inp, root)

        return self._run(fn, output_tensors,
                         _flat(output_tensors) + list(input_tensors))

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0

        def fn(comm):
            for i, out in enumerate(output_tensors):
                ins = input_tensors[i] if input_tensors else []
                _groupcomm.scatter(comm, out, ins, root)

        return self._run(fn, output_tensors,
                         list(output_tensors) + _flat(input_tensors))

    def alltoall_base(self, output, input, output_split_sizes,
                      input_split_sizes, opts=None):
        """all_to_all_single: blocks of rows (dim 0), even when both split
        lists are empty, else as they say."""
        out_splits = list(output_split_sizes)
        in_splits = list(input_split_sizes)

        def fn(comm):
            if not out_splits and not in_splits:
                if input.numel() % comm.size or output.numel() % comm.size:
                    raise InvalidArgumentError(
                        f"all_to_all_single: {input.numel()} and "
                        f"{output.numel()} elements do not split into "
                        f"{comm.size} blocks")
                _in_place(output,
                          lambda w: comm.all_to_all(w, input.contiguous()))
                return
            work = output.contiguous()
            _groupcomm.exchange(
                comm, _rows(input.contiguous(), in_splits, comm.size, "input"),
                _rows(work, out_splits, comm.size, "output"),
                _groupcomm.TAG_ALL_TO_ALL)
            if work is not output:
                output.copy_(work)

        return self._run(fn, [output], [output, input])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        def fn(comm):
            if len(input_tensors) != comm.size or len(output_tensors) != comm.size:
                raise InvalidArgumentError(
                    f"all_to_all: {len(input_tensors)} inputs and "
                    f"{len(output_tensors)} outputs for {comm.size} ranks")
            me = comm.rank
            if output_tensors[me].numel() != input_tensors[me].numel():
                raise InvalidArgumentError(
                    f"all_to_all: this rank's own block has "
                    f"{input_tensors[me].numel()} elements in and "
                    f"{output_tensors[me].numel()} out")
            works = [t.contiguous() for t in output_tensors]
            _groupcomm.exchange(comm, [t.contiguous() for t in input_tensors],
                                works, _groupcomm.TAG_ALL_TO_ALL)
            for out, w in zip(output_tensors, works):
                if w is not out:
                    out.copy_(w)

        return self._run(fn, output_tensors,
                         list(output_tensors) + list(input_tensors))

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0

        def fn(comm):
            for t in tensors:
                _in_place(t, lambda w: comm.broadcast(w, root))

        return self._run(fn, tensors, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        def fn(comm):
            for outs, inp in zip(output_tensors, input_tensors):
                if len(outs) != comm.size:
                    raise InvalidArgumentError(
                        f"allgather: {len(outs)} outputs for {comm.size} ranks"
                    )
                _groupcomm.check_blocks("allgather", outs, inp)
                inp = inp.contiguous()
                flat = torch.empty(
                    (comm.size,) + tuple(inp.shape), dtype=inp.dtype,
                    device=inp.device
                )
                comm.all_gather(flat, inp)
                for r, out in enumerate(outs):
                    out.copy_(flat[r])

        return self._run(fn, output_tensors,
                         _flat(output_tensors) + list(input_tensors))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op_name(opts.reduceOp) if opts is not None else "sum"

        def fn(comm):
            for out, ins in zip(output_tensors, input_tensors):
                flat = torch.cat([t.reshape(-1) for t in ins])
                res = torch.empty(out.numel(), dtype=out.dtype,
                                  device=out.device)
                comm.reduce_scatter(res, flat, op)
                out.copy_(res.view_as(out))

        return self._run(fn, output_tensors,
                         list(output_tensors) + _flat(input_tensors))

    # all_gather_into_tensor and reduce_scatter_tensor (FSDP2's collectives):
    # flat buffers, rank r's block at r.
    def _allgather_base(self, output, input, opts=None):
        def fn(comm):
            _in_place(output,
                      lambda w: comm.all_gather(w, input.contiguous()))

        return self._run(fn, [output], [output, input])

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op_name(opts.reduceOp) if opts is not None else "sum"

        def fn(comm):
            _in_place(output,
                      lambda w: comm.reduce_scatter(w, input.contiguous(), op))

        return self._run(fn, [output], [output, input])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        def fn(comm):
            for out, inp in zip(outputs, inputs):
                _in_place(out, lambda w: comm.all_gather(w, inp.contiguous()))

        return self._run(fn, outputs, list(outputs) + list(inputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _op_name(opts.reduceOp) if opts is not None else "sum"

        def fn(comm):
            for out, inp in zip(outputs, inputs):
                _in_place(out,
                          lambda w: comm.reduce_scatter(w, inp.contiguous(), op))

        return self._run(fn, outputs, list(outputs) + list(inputs))

    def barrier(self, opts=None):
        # On the device of the group's collectives (device_ids, else the
        # current CUDA device when the communicator is NCCL's).
        devices = [] if opts is None else list(getattr(opts, "device_ids", []))
        probe = []
        if self._rt._rt.communicator().device_memory:
            index = devices[0] if devices else torch.cuda.current_device()
            probe = [torch.empty(0, device=torch.device("cuda", index))]
        return self._run(lambda comm: comm.barrier(), [], probe)

    # Point-to-point calls return at once; the operation thread goes on
    # while the peer takes them (a ring of isend and irecv meets).
    def send(self, tensors, dst, tag):
        _contiguous("send", tensors)
        return self._run(
            lambda comm: [comm.post_send(t, dst, tag) for t in tensors],
            tensors, tensors, p2p=True)

    def recv(self, tensors, src, tag):
        _contiguous("recv", tensors)
        return self._run(
            lambda comm: [comm.post_recv(t, src, tag) for t in tensors],
            tensors, tensors, p2p=True)

    def recv_anysource(self, tensors, tag):
        raise InvalidArgumentError(
            "holdfast process group: a receive from any source (irecv or "
            "recv without src) is not supported; name the source rank")

    # ---- split_group ------------------------------------------------------
    # torch's split_group asks the parent for its CUDA backend and whether
    # it can split; a holdfast group can, on any device.
    def _get_backend(self, device):
        return _SplitSupport()

    def split_group(self, ranks, timeout=None, opts=None, group_name=None,
                    group_desc=None):
        """The subgroup of this group's ranks `ranks` that holds this rank
        (None if it is not in it)."""
        me = self.rank()
        if me not in ranks:
            return None
        world = self._ranks or list(range(self.size()))
        group = ProcessGroup(self._rt, list(ranks).index(me), len(ranks),
                             ranks=[world[r] for r in ranks])
        group._set_group_name(group_name)
        group._set_group_desc(group_desc or "holdfast split")
        return group

    def get_group_store(self):
        return _LocalStore(self._rt)


class _P2PWork(dist.Work):
    """The Work of a send or recv on CPU tensors: returned at once, also
    outside a step (an isend waited there would never meet its peer's
    irecv in a ring), and its wait() raises the operation's error. Only
    Python holds it (torch's isend, irecv and batch_isend_irecv), so a
    Python subclass keeps its overrides."""

    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None):
        self._fut.wait()
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self.exception() is None

    def exception(self):
        try:
            self._fut.value() if self._fut.done() else None
        except Exception as e:  # noqa: BLE001 -- it is the answer
            return e
        return None

    def get_future(self):
        return self._fut


class _SplitSupport:
    """What torch's split_group and new_group read of a group's backend
    once the default group is bound to a device: it can split, and a
    split needs nothing from the ranks outside the new group."""

    supports_splitting = True
    options = None

    def _set_sequence_number_for_group(self):
        pass

    def perform_nocolor_split(self, device):
        pass

    def eager_connect_single_device(self, device):
        pass


def _all_reduce(comm, tensor, op):
    """An all-reduce of the contiguous `tensor`, in place: NCCL sums in
    slot order (see below), the rest on the communicator's own."""
    if comm.device_memory and op in ("sum", "average"):
        _all_reduce_in_rank_order(comm, tensor, op)
    else:
        comm.all_reduce(tensor, op)


def _rows(tensor, splits, size, what):
    """`tensor` (contiguous) as `size` blocks of rows (dim 0), `splits`
    rows each (an even split when empty)."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not splits:
        if rows % size:
            raise InvalidArgumentError(
                f"all_to_all_single: the {what}'s {rows} rows do not split "
                f"into {size} blocks")
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows or min(splits) < 0:
        raise InvalidArgumentError(
            f"all_to_all_single: {what} split sizes {splits} do not divide "
            f"its {rows} rows among {size} ranks")
    flat = tensor.reshape(rows, -1) if tensor.numel() else tensor.reshape(
        rows, 0)
    return list(torch.split(flat, splits))


def _same_dtype(what, tensors):
    if len({t.dtype for t in tensors}) > 1:
        raise InvalidArgumentError(
            f"{what}: the tensors have several dtypes "
            f"({sorted(str(t.dtype) for t in tensors)}); give it one")


def _contiguous(what, tensors):
    for t in tensors:
        check_contiguous(t, what)


def _all_reduce_in_rank_order(comm, tensor, op):
    """A sum (or average) of `tensor` over the slots in which every element
    is folded in slot order, 0 first, wherever it sits in the buffer.

    NCCL's own all-reduce adds an element's operands in an order that
    depends on the element's position in the buffer (a ring starts each
    chunk at another rank), so the same gradients give other bits when DDP
    lays its buckets out anew after a recovery. Here every slot gathers
    every slot's buffer (all_gather) and folds them in slot order: that
    moves size/2 times the bytes of a ring all-reduce and holds size
    copies of the buffer while it runs. (Exchanging blocks with ncclSend
    and ncclRecv would move no more than a ring; with NCCL 2.28.9 over
    sockets, a process whose send/recv peer died crashed.)"""
    check_contiguous(tensor, "all_reduce")
    world = comm.size
    n = tensor.numel()
    if world == 1 or n == 0:
        return
    flat = tensor.view(-1)
    gathered = torch.empty(world * n, dtype=tensor.dtype, device=tensor.device)
    comm.all_gather(gathered, flat)
    parts = gathered.view(world, n)
    acc = parts[0].clone()
    for r in range(1, world):
        acc.add_(parts[r])
    if op == "average":
        acc.div_(world)
    flat.copy_(acc)


def _in_place(tensor, op):
    """op(t) on `tensor`, which op writes in place: on the tensor itself
    when it is contiguous, else on a contiguous copy written back after
    (a view with strides, such as a column of a matrix)."""
    if tensor.is_contiguous():
        op(tensor)
        return
    work = tensor.contiguous()
    op(work)
    tensor.copy_(work)


def _flat(lists):
    return [t for ts in lists for t in ts]


def _device_of(tensors, comm):
    """The CUDA device of `tensors` (None for CPU tensors), checked against
    the memory `comm` takes. InvalidArgumentError for a mix of devices, or
    for tensors the communicator cannot take (CPU tensors it takes through
    the device: see _run)."""
    for t in tensors:
        check_dtype(t, "holdfast process group")
    kinds = {(t.device.type, t.device.index) for t in tensors}
    if len(kinds) > 1:
        raise InvalidArgumentError(
            "holdfast process group: one call's tensors are on several "
            f"devices ({sorted(str(k) for k in kinds)}); put them on one"
        )
    device = None
    if kinds:
        kind, index = next(iter(kinds))
        if kind == "cuda":
            device = torch.device("cuda", index)
        elif kind != "cpu":
            raise InvalidArgumentError(
                f"holdfast process group: {kind} tensors are not supported "
                "(CPU tensors on Gloo, CUDA tensors on NCCL)"
            )
    if device is not None and not comm.device_memory:
        raise InvalidArgumentError(
            "holdfast process group: CUDA tensors need the NCCL backend; this "
            f"job's communicator is {comm.backend!r} (run it with "
            "HOLDFAST_BACKEND=nccl, or Runtime(backend='nccl'))"
        )
    return device


def _fail(fut, error):
    if not fut.done():
        fut.set_exception(error)


def allreduce_hook(process_group, bucket):
    """DDP communication hook: sum the bucket, divide by the live world size.

    DDP's own division uses the size the group had when DDP was built;
    this hook reads the size at every step, so it stays right after a
    shrink. The bucket is checked for NaN and Inf before it meets the
    other slots' (Runtime.check_finite): a slot that finds one is named
    the source of the step's numeric anomaly."""
    tensor = bucket.buffer()
    runtime = getattr(process_group, "_rt", None) or _runtime.current_runtime()
    if runtime is not None:
        # The slots' norms are comparable only where every slot holds the
        # same parameters: DDP over the whole world, not over a subgroup
        # (a pipeline stage's, whose neighbours hold other layers).
        whole = getattr(process_group, "_ranks", None) is None
        runtime.check_finite("gradient bucket", tensor, compare_norms=whole)
    size = process_group.size()
    fut = process_group.allreduce([tensor]).get_future()
    return fut.then(lambda _: tensor.div_(size))


def _create(options, backend_options):
    """The group of torch's init_process_group (the world) or new_group
    (a subgroup, by its world ranks; all of them is the world)."""
    runtime = _runtime.current_runtime()
    ranks = list(options.global_ranks_in_group)
    if runtime is None or not ranks or ranks == list(range(max(runtime.world_size, 1))):
        return ProcessGroup(runtime, options.group_rank, options.group_size)
    return ProcessGroup(runtime, options.group_rank, options.group_size,
                        ranks=ranks)


if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    # CPU tensors run on Gloo, CUDA tensors on NCCL (HOLDFAST_BACKEND=nccl).
    dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                  devices=["cpu", "cuda"])


class _LocalStore(dist.Store):
    """The store init_process_group needs. holdfast's rendezvous goes
    through its controller; torch's store-based barrier in
    init_process_group (1.x) would count the processes of one generation
    only, and a standby joins later, so this store answers that barrier
    from the runtime's world size."""

    _BARRIER = getattr(
        dist.distributed_c10d, "STORE_BASED_BARRIER_PREFIX", "store_based_barrier_key"
    )

    def __init__(self, runtime):
        super().__init__()
        self._rt = runtime
        self._data = {}

    def set(self, key, value):
        self._data[key] = value

    def get(self, key):
        return self._data[key]

    def add(self, key, value):
        if key.endswith(self._BARRIER) or self._BARRIER + ":" in key:
            return max(self._rt.world_size, 1)
        self._data[key] = int(self._data.get(key, 0)) + value
        return self._data[key]

    def check(self, keys):
        return all(k in self._data for k in keys)

    def wait(self, keys, timeout=None):
        missing = [k for k in keys if k not in self._data]
        if missing:
            raise InvalidArgumentError(f"holdfast local store: no key {missing}")

    def delete_key(self, key):
        return self._data.pop(key, None) is not None

    def num_keys(self):
        return len(self._data)


def init_process_group(runtime=None, device_id=None):
    """dist.init_process_group(backend="holdfast") for `runtime` (default:
    the current one). Returns the default process group. `device_id`
    (a CUDA device) binds the group to it, as torch's does; torch's
    split_group needs that."""
    runtime = runtime or _runtime.current_runtime()
    if runtime is None:
        raise InvalidArgumentError(
            "holdfast.distributed.init_process_group: create a holdfast.Runtime "
            "first"
        )
    dist.init_process_group(
        backend=BACKEND,
        store=_LocalStore(runtime),
        rank=max(runtime.slot, 0),
        world_size=max(runtime.world_size, 1),
        device_id=device_id,
    )
    return dist.distributed_c10d._get_default_group()


_ddp_cache = {}


def _detach(model):
    for attr in ("reducer", "logger"):
        if hasattr(model, attr):
            setattr(model, attr, None)


def ddp(runtime, module, process_group=None, **kwargs):
    """DistributedDataParallel(module) for the runtime's current generation,
    with allreduce_hook; rebuilt when the generation changes. Call it inside
    the step function. `process_group`: the world's by default, or a
    subgroup's (a data-parallel dimension of a device mesh)."""
    key = id(module)
    cached = _ddp_cache.get(key)
    if cached is not None and cached[0] == runtime.generation:
        return cached[1]
    if cached is not None:
        # The old wrapper's reducer hooks the same parameters; drop it so
        # its hooks go with it (a reducer stopped mid-iteration by a
        # failure would otherwise see the next backward as a second one).
        _detach(cached[1])
        if cached[2] is not None:
            runtime._groups.remove(cached[2])
    group = process_group or dist.distributed_c10d._get_default_group()
    resized = None
    if (getattr(group, "_ranks", None) is None
            and dist.ProcessGroup.size(group) != runtime.world_size):
        # C++ (DDP's reducer and its checks) reads the size the group was
        # built with; after a shrink, DDP gets a group of the new size.
        resized = ProcessGroup(runtime, max(runtime.slot, 0), runtime.world_size)
        group = resized
    model = torch.nn.parallel.DistributedDataParallel(
        module, process_group=group, **kwargs
    )
    model.register_comm_hook(group, allreduce_hook)
    _ddp_cache[key] = (runtime.generation, model, resized)
    return model
