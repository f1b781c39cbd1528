"""The Python face of holdfast's runtime: state from torch modules and
optimizers, a communicator on torch tensors, and the step loop."""

import atexit
import ctypes
import math
import mmap
import os
import queue
import threading
import weakref

import torch

from . import _C, _nccl
from ._tensors import buffer, host_buffer
from .errors import InvalidArgumentError

_REDUCE = dict(_C.REDUCE_CODES)


def _reduce_code(op):
    try:
        return _REDUCE[str(op).lower()]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown reduce op {op!r} (one of {', '.join(sorted(_REDUCE))})"
        ) from None


class _OpQueue:
    """Runs a runtime's asynchronous operations (those of its torch.distributed
    groups) on one thread of their own, one at a time, in the order they
    were issued: every slot issues its collectives in the same order, so
    they meet in that order. The operations release the GIL while they
    wait on the network, so the caller (DDP's backward) computes
    meanwhile.

    A point-to-point operation must not hold that thread until its peer
    takes it (a ring of sends would never meet its receives): its task
    posts it and hands the wait to a second thread (wait_later). drain()
    waits for both."""

    def __init__(self):
        self._idle = threading.Condition()
        self._pending = 0
        self._lanes = {}  # name: its task queue, served by a thread

    def submit(self, task):
        """Queues `task()`; it must not raise (it reports through the
        future it completes)."""
        self._put("holdfast-ops", task)

    def wait_later(self, task):
        """Queues `task()`, which waits for a posted point-to-point
        operation, behind the waits queued before it."""
        self._put("holdfast-p2p", task)

    def drain(self):
        """Returns once every queued operation has ended."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)

    def _put(self, lane, task):
        with self._idle:
            self._pending += 1
            tasks = self._lanes.get(lane)
            if tasks is None:
                tasks = self._lanes[lane] = queue.Queue()
                threading.Thread(target=self._serve, args=(tasks,), name=lane,
                                 daemon=True).start()
        tasks.put(task)

    def _serve(self, tasks):
        while True:
            task = tasks.get()
            try:
                task()
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()


class _DeviceIssuer:
    """Issues the operations of one holdfast.distributed call on an NCCL
    communicator, from the operation thread, with ProcessGroupNCCL's
    stream semantics: they run on the communicator's stream (`main`),
    after `ready` (an event the caller recorded on its own stream when it
    issued the call), and the torch work between them (staging copies)
    runs on `main` too, in order. Each call returns once its op is queued
    on the device, not once it completed; finish() waits for that."""

    def __init__(self, comm, device, ready, host=None):
        self.device = device
        self.main = torch.cuda.ExternalStream(comm.cuda_stream, device=device)
        self.main.wait_event(ready)
        self._pending = []  # (PendingOp, its after_event): kept until done
        self.host = host  # a _HostStaging when the call's tensors are CPU's

    def __call__(self, method, *args):
        after = torch.cuda.Event()
        after.record(self.main)
        op = method(*args, after_event=after.cuda_event, wait=False)
        self._pending.append((op, after))
        stream = op.queued()
        if stream and stream != self.main.cuda_stream:
            # A point-to-point op runs on a stream of its own.
            done = torch.cuda.Event()
            done.record(torch.cuda.ExternalStream(stream, device=self.device))
            self.main.wait_event(done)

    def finish(self):
        """Waits until every op is done on the device, then until the torch
        work queued after them on `main` is too (the staging buffers may
        be freed then). Raises the first op's error."""
        error = None
        for op, _ in self._pending:
            try:
                op.wait()
            except Exception as e:  # noqa: BLE001 -- the first one is raised
                error = error or e
        self._pending = []
        done = torch.cuda.Event()
        done.record(self.main)
        done.synchronize()
        if self.host is not None:
            self.host.finish()
        if error is not None:
            raise error


class _HostStaging:
    """CPU tensors of a call on an NCCL communicator, staged through the
    device: each one an op takes is copied to `device` (on the current
    stream, so after the work queued before the op), the op runs on the
    copy, and the copy is written back into the CPU tensor once the op is
    done. One communicator keeps one order of operations, whatever the
    tensors' device. A collective's outputs are written back as soon as
    the op is issued (the copy waits for it), since the call may read
    them next; a point-to-point call's (`defer`) when it is waited for,
    so the operation thread goes on while its peer takes it.
    `to_device(t)`: the device copy of t (a parameter for tests)."""

    def __init__(self, device, defer=False, to_device=None):
        self._to_device = to_device or (
            lambda t: t.to(device, copy=True))
        self._defer = defer
        self._issued = []  # (cpu, device copy) of the op being issued
        self._later = []  # (cpu, device copy): written back by finish()
        self._keep = []  # device copies an op may still be using

    def stage(self, tensor):
        """The tensor an op takes in place of `tensor`: a device copy of a
        CPU tensor, or `tensor` itself."""
        if tensor.device.type != "cpu":
            return tensor
        copy = self._to_device(tensor)
        self._issued.append((tensor, copy))
        return copy

    def issued(self, output):
        """The op that took the tensors staged since the last call is
        issued; it writes `output` (None: nothing, as a send)."""
        staged, self._issued = self._issued, []
        self._keep.extend(copy for _, copy in staged)
        written = [(cpu, copy) for cpu, copy in staged if cpu is output]
        if self._defer:
            self._later.extend(written)
            return
        for cpu, copy in written:
            cpu.copy_(copy)

    def finish(self):
        """Every op is done: write back what waited for it."""
        later, self._later, self._keep = self._later, [], []
        for cpu, copy in later:
            cpu.copy_(copy)


def _loaded_cudart():
    """The CUDA runtime library torch loaded (ctypes), or None: its
    cudaHostRegister, and its cudaGetLastError to clear a refusal."""
    global _cudart
    if _cudart is None:
        _cudart = False
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps
                         if "/libcudart.so" in line}
            if len(paths) == 1:
                lib = ctypes.CDLL(paths.pop())
                lib.cudaHostRegister.restype = ctypes.c_int
                lib.cudaHostRegister.argtypes = [
                    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
                lib.cudaGetLastError.restype = ctypes.c_int
                _cudart = lib
        except (OSError, AttributeError):
            pass
    return _cudart or None


_cudart = None


class _DeviceState:
    """Registered CUDA tensors and their pinned host copies, which the
    runtime snapshots and restores as if they were the tensors.

    A step's end starts the copies into the host copies (copy_out) and
    returns: they run on a stream of their own while the next step
    computes. Each device's copies record one event, which the runtime
    waits for before it reads the host copies (RunOptions::state_ready:
    on the backup thread, or between the steps), and which the next
    step's writes to the tensors wait for on the device (fence)."""

    def __init__(self):
        self._pairs = {}  # name -> (device tensor, pinned host tensor)
        self._streams = {}  # device -> the copy stream
        self._events = {}  # device -> the event the copies record
        self._pinned = []  # [begin, end) byte ranges this pinned
        self.unpinned = 0  # mirrors whose partition could not be pinned

    def add(self, name, tensor):
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor)  # the values at registration, synchronously
        self._pairs[name] = (tensor, host)
        self.prepare(tensor.device)

    def prepare(self, device):
        """The event of `device`'s copies, made now if it is new (its handle
        goes to the runtime when run() starts)."""
        if device not in self._events:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            event.synchronize()  # created now: its handle is fixed
            self._events[device] = event

    def add_mirror(self, name, tensor, host, running):
        """`host` (a view of a sharded array's partition, in the runtime's
        memory) becomes the host copy of `tensor`. Its pages are pinned
        where CUDA allows (else the copies into it are synchronous). While
        run() is under way only a device whose event the runtime has can
        take one."""
        if running and tensor.device not in self._events:
            raise InvalidArgumentError(
                f"mirror_shard: '{name}' is on {tensor.device}, which had no "
                "CUDA state when run() started: make it the current device "
                "(torch.cuda.set_device) before run()")
        if not self._pin(host):
            self.unpinned += 1
        with torch.no_grad():
            tensor.copy_(host)  # the partition's values, synchronously
        self._pairs[name] = (tensor, host)
        self.prepare(tensor.device)

    def _pin(self, host):
        """Pins the pages under `host` that no earlier call pinned (two
        partitions may share a page); False if CUDA refused."""
        page = mmap.PAGESIZE
        begin = host.data_ptr() // page * page
        end = -(-(host.data_ptr() + host.numel() * host.element_size())
                // page) * page
        todo = [(begin, end)]
        for b, e in self._pinned:
            todo = [piece for lo, hi in todo
                    for piece in ((lo, min(hi, b)), (max(lo, e), hi))
                    if piece[0] < piece[1]]
        cudart = _loaded_cudart()
        if cudart is None:
            return not todo
        ok = True
        for lo, hi in todo:
            if cudart.cudaHostRegister(ctypes.c_void_p(lo),
                                       ctypes.c_size_t(hi - lo), 0) == 0:
                self._pinned.append((lo, hi))
            else:
                # Not sticky, but left as the thread's last error it would
                # fail torch's next launch check.
                cudart.cudaGetLastError()
                ok = False
        return ok

    def host(self, name):
        return self._pairs[name][1]

    def event_handles(self):
        """The cudaEvent_t of each device's copies, for the runtime."""
        return [e.cuda_event for e in self._events.values()]

    def copy_out(self):
        """Starts copying every tensor into its host copy, after the work
        queued so far on each device's current stream, on a stream of its
        own, and returns; the copies record the devices' events."""
        for stream, device in self._run_on_copy_streams(
                lambda dev, host: host.copy_(dev, non_blocking=True)):
            self._events[device].record(stream)

    def fence(self):
        """Makes each device's current stream wait for the copies under
        way (the next writes to the tensors come after them), without
        blocking the host."""
        for device, event in self._events.items():
            torch.cuda.current_stream(device).wait_event(event)

    def wait(self):
        """Returns once the copies under way are done."""
        for event in self._events.values():
            event.synchronize()

    def copy_in(self):
        """Copies every host copy back into its tensor (after a restore);
        returns once done."""
        for stream, _ in self._run_on_copy_streams(
                lambda dev, host: dev.copy_(host, non_blocking=True)):
            stream.synchronize()

    def _run_on_copy_streams(self, copy):
        used = []
        for dev, host in self._pairs.values():
            stream = self._streams.get(dev.device)
            if stream is None:
                stream = torch.cuda.Stream(device=dev.device)
                self._streams[dev.device] = stream
            if (stream, dev.device) not in used:
                stream.wait_stream(torch.cuda.current_stream(dev.device))
                used.append((stream, dev.device))
            with torch.cuda.stream(stream):
                copy(dev, host)
        return used


class Communicator:
    """A communicator of one generation, on torch tensors: CPU tensors
    when it runs on Gloo, CUDA tensors when it runs on NCCL
    (HOLDFAST_BACKEND=nccl; `device_memory` says which).

    Every call blocks until the operation is done and raises a holdfast
    error (PeerLostError, TimeoutError, AbortedError, ...) if it fails.
    On CUDA tensors an operation starts on the device after the work
    already queued on the tensor's current stream, and is done on the
    device when the call returns. `timeout` is in seconds (0: the
    communicator's default). A call first waits for the operations that
    the runtime's torch.distributed groups issued before it, so that
    every slot's operations stay in one order.
    """

    def __init__(self, comm, ops=None, issuer=None):
        self._comm = comm
        self._ops = ops
        self._issuer = issuer  # a _DeviceIssuer (holdfast.distributed)
        self.device_memory = comm.device_memory

    def _in_order(self):
        if self._ops is not None:
            self._ops.drain()

    def _buf(self, tensor, what):
        if self._issuer is not None and self._issuer.host is not None:
            tensor = self._issuer.host.stage(tensor)
        return buffer(tensor, what, self.device_memory)

    def _issue(self, tensor, method, *args, wait=True, writes=True):
        """method(*args): blocking, or with `wait` False returning an
        object whose wait() blocks until the op is done (an issuer's
        finish() waits for its ops instead). `tensor`: the one the op
        writes, unless `writes` is False (a send)."""
        if self._issuer is not None:
            self._issuer(method, *args)
            if self._issuer.host is not None:
                self._issuer.host.issued(tensor if writes else None)
            return _Done()
        if self.device_memory:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(tensor.device))
            return method(*args, after_event=ready.cuda_event, wait=wait)
        return method(*args, wait=wait)

    @property
    def rank(self):
        return self._comm.rank

    @property
    def size(self):
        return self._comm.size

    @property
    def generation(self):
        return self._comm.generation

    @property
    def backend(self):
        """"gloo" or "nccl"."""
        return self._comm.backend

    def all_reduce(self, tensor, op="sum", timeout=0.0):
        self._in_order()
        ptr, n, dt = self._buf(tensor, "all_reduce")
        self._issue(tensor, self._comm.all_reduce, ptr, n, dt, _reduce_code(op),
                    timeout)
        return tensor

    def broadcast(self, tensor, root=0, timeout=0.0):
        self._in_order()
        ptr, n, dt = self._buf(tensor, "broadcast")
        self._issue(tensor, self._comm.broadcast, ptr, n, dt, int(root), timeout)
        return tensor

    def all_gather(self, output, input, timeout=0.0):
        """`output` holds size * input.numel() elements, rank r's at r."""
        self._in_order()
        sp, sn, sdt = self._buf(input, "all_gather input")
        rp, rn, rdt = self._buf(output, "all_gather output")
        self._check_pair("all_gather", sdt, rdt, rn, sn * self.size)
        self._issue(output, self._comm.all_gather, sp, rp, sn, sdt, timeout)
        return output

    def reduce_scatter(self, output, input, op="sum", timeout=0.0):
        """`input` holds size blocks of output.numel() elements."""
        self._in_order()
        sp, sn, sdt = self._buf(input, "reduce_scatter input")
        rp, rn, rdt = self._buf(output, "reduce_scatter output")
        self._check_pair("reduce_scatter", sdt, rdt, sn, rn * self.size)
        self._issue(output, self._comm.reduce_scatter, sp, rp, rn, sdt,
                    _reduce_code(op), timeout)
        return output

    def all_to_all(self, output, input, timeout=0.0):
        self._in_order()
        sp, sn, sdt = self._buf(input, "all_to_all input")
        rp, rn, rdt = self._buf(output, "all_to_all output")
        self._check_pair("all_to_all", sdt, rdt, rn, sn)
        if sn % self.size:
            raise InvalidArgumentError(
                f"all_to_all: {sn} elements do not split into {self.size} blocks"
            )
        self._issue(output, self._comm.all_to_all, sp, rp, sn // self.size, sdt,
                    timeout)
        return output

    def barrier(self, timeout=0.0):
        self._in_order()
        if self.device_memory:
            self._issue(torch.empty(0, device="cuda"), self._comm.barrier,
                        timeout)
        else:
            self._comm.barrier(timeout)

    def send(self, tensor, peer, tag=0, timeout=0.0):
        self._in_order()
        ptr, n, dt = self._buf(tensor, "send")
        self._issue(tensor, self._comm.send, ptr, n, dt, int(peer), int(tag),
                    timeout, writes=False)

    def recv(self, tensor, peer, tag=0, timeout=0.0):
        self._in_order()
        ptr, n, dt = self._buf(tensor, "recv")
        self._issue(tensor, self._comm.recv, ptr, n, dt, int(peer), int(tag),
                    timeout)
        return tensor

    def post_send(self, tensor, peer, tag=0, timeout=0.0):
        """send() without the wait: returns an object whose wait() blocks
        until the peer took the tensor (raising the op's error). The
        tensor must stay alive and unchanged until then."""
        ptr, n, dt = self._buf(tensor, "send")
        return self._issue(tensor, self._comm.send, ptr, n, dt, int(peer),
                           int(tag), timeout, wait=False, writes=False)

    def post_recv(self, tensor, peer, tag=0, timeout=0.0):
        """recv() without the wait (see post_send)."""
        ptr, n, dt = self._buf(tensor, "recv")
        return self._issue(tensor, self._comm.recv, ptr, n, dt, int(peer),
                           int(tag), timeout, wait=False)

    def abort(self, reason="aborted from Python"):
        self._comm.abort(reason)

    def dump_trace(self):
        return self._comm.dump_trace()

    @staticmethod
    def _check_pair(what, sdt, rdt, have, want):
        if sdt != rdt:
            raise InvalidArgumentError(f"{what}: input and output dtypes differ")
        if have != want:
            raise InvalidArgumentError(
                f"{what}: the buffer holds {have} elements, {want} expected"
            )


class _Done:
    def wait(self):
        pass


class StepContext:
    """What the step function gets: step (1-based), slot (this member's
    place in the world: its rank in comm and in the torch.distributed
    group), world_size, generation, comm (this generation's Communicator)
    and runtime. `rank` is the same number, under torch.distributed's
    name for it."""

    def __init__(self, ctx, runtime):
        self.step = ctx.step
        self.slot = ctx.slot
        self.rank = ctx.slot
        self.world_size = ctx.world_size
        self.generation = ctx.generation
        self.comm = Communicator(ctx.comm, runtime._ops)
        self.runtime = runtime


_current = None


def _close_at_exit(ref):
    runtime = ref()
    if runtime is not None and getattr(runtime, "_rt", None) is not None:
        rt, runtime._rt = runtime._rt, None
        del rt  # leaves the job and joins the runtime's threads


def _flip_largest_clear_bit(t, bit):
    """The fault gradflip: flips bit `bit` of the float32 of largest
    magnitude in `t` whose bit is clear and whose flip leaves it finite
    (bit 30 of a value below 1 multiplies it by 2^128)."""
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise InvalidArgumentError(
            f"fault gradflip: it flips a bit of contiguous float32 values, "
            f"not {t.dtype} (contiguous: {t.is_contiguous()})")
    with torch.no_grad():
        flat = t.view(-1)
        ints = flat.view(torch.int32)
        mask = (1 << bit) - (1 << 32 if bit == 31 else 0)
        flipped = (ints ^ mask).view(torch.float32)
        clear = ((ints & mask) == 0) & torch.isfinite(flipped)
        size = torch.where(clear, flat.abs(), torch.full_like(flat, -1.0))
        if size.numel() == 0:
            return
        at = int(torch.argmax(size))
        if float(size[at]) >= 0:
            ints[at] = ints[at] ^ mask


def current_runtime():
    """The most recently created Runtime of this process (or None)."""
    return _current


class Runtime:
    """This process's place in a fault-tolerant job.

    Options (all optional; the HOLDFAST_* environment set by holdfast-run
    fills the rest): controller, token, token_file, host, topology_block,
    faults, preferred_slot, replicas, verify_backups ("arrival" or
    "restore"), tp_size, pp_size, checkpoint_dir, checkpoint_every,
    max_step_retries, backend ("gloo", or "nccl" for CUDA tensors;
    HOLDFAST_BACKEND), device (the CUDA device NCCL runs on;
    HOLDFAST_DEVICE, else LOCAL_RANK), and timeout, connect_timeout,
    join_timeout, recovery_timeout in seconds.

    A runtime whose build has the NCCL backend first checks that torch's
    NCCL is the one holdfast was built against (FencedError otherwise).
    """

    def __init__(self, **options):
        global _current
        _nccl.check()
        self._rt = _C.Runtime(**options)
        self._groups = []  # process groups that defer errors to step ends
        self._ops = _OpQueue()  # their operations, in issue order
        self._sharded = {}  # sharded arrays: name -> (dtype, global numel)
        self._in_step = False
        self._step_place = (0, 1)  # (slot, world size) of the running step
        self._step_comm = None  # the running step's C++ communicator
        # Registered tensors as given (name, tensor): they stay alive with
        # the runtime, and their version counters tell an in-place write
        # before the fence. Their versions after the last step that ended
        # (None: nothing to compare with); whether this step's first
        # begin_state_update() came.
        self._watched = []
        self._versions = None
        self._fence_checked = False
        self._device_state = _DeviceState()  # registered CUDA tensors
        self._running = False  # in run()
        self._backend = (options.get("backend")
                         or os.environ.get("HOLDFAST_BACKEND", "gloo"))
        _current = self
        # The C++ runtime's threads (NCCL's among them) must end before the
        # interpreter and the CUDA runtime shut down: process groups refer
        # back to the runtime, so the cycle might never be collected.
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- where this process stands ---------------------------------------
    @property
    def standby(self):
        return self._rt.standby

    @property
    def slot(self):
        return self._rt.slot

    @property
    def world_size(self):
        return self._rt.world_size

    @property
    def generation(self):
        return self._rt.generation

    @property
    def committed_step(self):
        return self._rt.committed_step

    @property
    def in_step(self):
        return self._in_step

    def communicator(self):
        """The current generation's Communicator (builds it if needed)."""
        return Communicator(self._rt.communicator(), self._ops)

    # ---- state -------------------------------------------------------------
    def register_tensor(self, name, tensor):
        """Registers a tensor's bytes, in place, as replicated state under
        `name`: a CPU tensor or a CUDA tensor.

        The tensor must keep its storage (update it in place, as optimizers
        do); a recovery writes the restored bytes into it. Its values must be
        the same on every slot (a fresh start warns about one that differs).

        A CUDA tensor is not copied on the device: the runtime keeps a
        pinned host copy of it, which each step's end fills from the device
        on a stream of its own (after the step's work on the tensor's
        current stream), while the next step computes, and each restore
        writes back. The runtime reads the host copy only once that copy
        is done, and `begin_state_update()` makes the step's later writes
        to the tensor wait for it on the device.
        """
        data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        if isinstance(data, torch.Tensor) and data.device.type == "cuda":
            buffer(data, f"state '{name}'", device_memory=True)
            self._device_state.add(name, data)
            data = self._device_state.host(name)
        ptr, n, _ = host_buffer(data, f"state '{name}'")
        self._rt.register_state(name, ptr, n * data.element_size())
        # The tensor itself (it keeps the storage alive too): .data of a
        # Parameter has a version counter of its own, which the optimizer's
        # in-place updates do not move.
        self._watched.append((name, tensor))

    def register_state_dict(self, state_dict, prefix):
        """Registers every tensor of a state_dict, as `prefix.key`."""
        for key, value in state_dict.items():
            if not isinstance(value, torch.Tensor):
                raise InvalidArgumentError(
                    f"state '{prefix}.{key}' is a {type(value).__name__}, not a "
                    "tensor; holdfast restores tensors in place only"
                )
            self.register_tensor(f"{prefix}.{key}", value)

    def register_module(self, module, prefix="model"):
        """Registers a module's parameters and buffers (its state_dict)."""
        self.register_state_dict(module.state_dict(keep_vars=False), prefix)

    def register_optimizer(self, optimizer, prefix="optimizer"):
        """Registers an optimizer's per-parameter state tensors.

        The state must exist (optimizers create it lazily at their first
        step: take one, or fill it, before registering) and be tensors.
        """
        state = optimizer.state_dict()["state"]
        if not state:
            raise InvalidArgumentError(
                f"optimizer '{prefix}': its state is empty (optimizers create "
                "it at their first step); initialize it before registering, "
                "e.g. zero momentum buffers"
            )
        for index in sorted(state):
            for key in sorted(state[index]):
                value = state[index][key]
                name = f"{prefix}.{index}.{key}"
                if not isinstance(value, torch.Tensor):
                    raise InvalidArgumentError(
                        f"optimizer state '{name}' is a {type(value).__name__}, "
                        "not a tensor; holdfast restores tensors in place only"
                    )
                self.register_tensor(name, value)

    def register_sharded_state(self, name, global_numel, dtype=torch.float32,
                               unit_numel=1):
        """Registers a sharded global array; returns this slot's partition as
        a tensor backed by the runtime's memory (zeroed). Partitions move
        after a shrink: read shard(name) at every step."""
        size = torch.empty((), dtype=dtype).element_size()
        self._rt.register_sharded_state(name, global_numel * size,
                                        unit_numel * size)
        self._sharded[name] = (dtype, int(global_numel))
        return self.shard(name, dtype)

    def mirror_shard(self, name, tensor):
        """Makes the partition of the sharded array `name` the host copy of
        `tensor`, a contiguous CUDA tensor of the array's dtype with at most
        the partition's elements: FSDP2's local shard of a parameter or of
        its optimizer state, for one. As for a CUDA tensor given to
        register_tensor, each step's end starts copying the tensor into the
        partition's first elements on a stream of its own, while the next
        step computes, the runtime reads the partition only once that copy
        is done, and each restore writes the partition back into the
        tensor; the device holds no second copy. The call itself writes
        the partition's values (a fresh start's, or restored ones) into the
        tensor. The partition's pages are pinned where CUDA allows (else
        the copies wait).

        Call it before the first step ends (in on_restore, say), with the
        tensor's device current when run() started. The partition must not
        move, so the world must keep its size (run with standbys)."""
        if name not in self._sharded:
            raise InvalidArgumentError(
                f"mirror_shard: '{name}' is not a sharded array "
                "(register_sharded_state)")
        dtype, _ = self._sharded[name]
        data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        if not isinstance(data, torch.Tensor) or data.device.type != "cuda":
            raise InvalidArgumentError(
                f"mirror_shard: '{name}' needs a CUDA tensor, not one on "
                f"{getattr(data, 'device', type(data).__name__)}; on the CPU, "
                "train on the partition itself (shard(name))")
        if data.dtype != dtype:
            raise InvalidArgumentError(
                f"mirror_shard: '{name}' holds {dtype}, the tensor is "
                f"{data.dtype}")
        buffer(data, f"shard '{name}'", device_memory=True)
        part = self.shard(name, dtype)
        if data.numel() > part.numel():
            raise InvalidArgumentError(
                f"mirror_shard: the tensor has {data.numel()} elements, the "
                f"partition of '{name}' {part.numel()}")
        self._device_state.add_mirror(
            name, data, part[:data.numel()].view(data.shape), self._running)

    def shard(self, name, dtype=torch.float32):
        """The current partition of a sharded array: a tensor view of it,
        with .holdfast_offset (first element's index in the global array)."""
        view = self._rt.shard(name)
        size = torch.empty((), dtype=dtype).element_size()
        if view["bytes"] == 0:
            t = torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(view["data"], dtype=dtype)
        t.holdfast_offset = view["offset"] // size
        return t

    def register_data_position(self, name, tensor):
        """Registers a one-element int64 CPU tensor as the trainer's data
        position (the index of the next batch it consumes) and as replicated
        state. The step function reads it, consumes data from there and
        advances it in place (after begin_state_update()); between the
        steps and after each restore the runtime moves it past the data
        the job skips after a numeric anomaly (and run's `skip_data`)."""
        if tensor.dtype != torch.int64 or tensor.numel() != 1:
            raise InvalidArgumentError(
                f"data position '{name}': a one-element int64 tensor is "
                f"needed, not {tensor.dtype} with {tensor.numel()} elements"
            )
        ptr, _, _ = host_buffer(tensor, f"data position '{name}'")
        self._rt.register_data_position(name, ptr)
        self._watched.append((name, tensor))

    # ---- numeric checks ----------------------------------------------------
    def check_finite(self, name, tensors, compare_norms=True):
        """Checks this slot's own values (its local gradients, before the
        all-reduce) for NaN and Inf; False if any. The slot that finds one
        is named the source of the step's anomaly, and the job rolls back
        to a clean committed step at the step's end and skips its data. The
        step goes on as usual (the all-reduce spreads the NaN). Finite
        values count toward the step's local norm, which the controller
        compares across the slots (a bit flipped in one slot's gradients).
        `tensors`: a tensor or an iterable of them, of any floating dtype
        and device. `compare_norms=False` leaves them out of the norm
        comparison: values that differ between slots by design (a
        subgroup's, a shard's). The injected fault nan:slot=S:step=N makes
        the first one NaN; gradflip:slot=S:step=N flips a bit of its
        largest value."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        tensors = [t for t in tensors if t is not None]
        if tensors and self._rt.inject_nan_now():
            with torch.no_grad():
                tensors[0].view(-1)[0] = float("nan")
        if tensors:
            bit = self._rt.gradient_flip_bit_now()
            if bit >= 0:
                _flip_largest_clear_bit(tensors[0], bit)
        squares = 0.0
        for t in tensors:
            # In float64 the norm is finite exactly when every value is
            # (a float32's square cannot overflow it): one pass, one sync.
            norm = float(torch.linalg.vector_norm(t, dtype=torch.float64))
            if not math.isfinite(norm):
                self._rt.report_non_finite(name)
                return False
            squares += norm * norm
        if tensors and compare_norms:
            self._rt.report_local_squares(squares)
        return True

    # ---- the step loop -----------------------------------------------------
    def run(self, step_fn, steps, snapshot_every=1, metrics=None,
            on_restore=None, snapshot_copy="auto", skip_data=(),
            spike_factor=0.0, start_step=0, dcp_dir=None, dcp_every=0,
            dcp_keep=3, standby_warmup=None):
        """Runs steps committed+1 .. `steps` with automatic recovery.

        `step_fn(ctx)` gets a StepContext. A holdfast error it raises (or
        one a holdfast process group recorded during the step) makes the
        runtime recover and resume from the last committed step; any other
        exception ends the run and is raised again here. Returns a
        RunResult (final_step, world_size, slot, recoveries, ...).
        `on_restore(step)` runs whenever the registered tensors were restored
        (at the start and after each recovery), before the next step.

        `standby_warmup()` runs once in a standby, before it waits for a
        slot: a forward and backward pass of the model on throwaway inputs,
        say, without communicating, so that what a process pays at its
        first step on a GPU (CUDA's lazily loaded kernels, cuBLAS's
        handles, the caching allocator's blocks) is paid before the standby
        takes a slot rather than while the survivors wait for it. It must
        not change registered state (a job that fails before its first
        commit starts afresh from every member's own) and should leave the
        random number generators as it found them
        (`torch.random.fork_rng`). What it raises is logged, and the
        standby waits for a slot as usual.

        `snapshot_copy` says where each snapshot is copied out of the
        registered tensors:
        - "auto" (the default): on the backup thread while the next step
          computes when the step just snapshotted called
          `ctx.runtime.begin_state_update()` before it wrote registered
          state (before `optimizer.step()`), else between the steps. If a
          step then skips the call, the snapshot it may have written under
          is dropped (`RunResult.snapshots_unfenced`, and a warning).
        - "between_steps": always between the steps.
        - "during_next_step": always during the next step; a step that
          does not call `begin_state_update()` ends the run with
          FencedError (FailedPrecondition) naming the call.
        A bad value raises ValueError.
        With the copy during the next step, `begin_state_update()` checks
        that no tensor given to `register_tensor` (or through
        register_module, register_state_dict, register_optimizer) was
        written in place since the step before ended: a step that wrote
        one first counts as not fenced, as if it had not called it, and
        the warning or error names the tensor. The check reads the
        tensors' version counters, which torch ops that write in place
        move; writes through `.data`, numpy views or raw pointers do not,
        and go unseen.

        After each step the metrics "loss" and "grad_norm" (from `metrics`)
        are checked for NaN and Inf, and "loss" for a spike above
        `spike_factor` times its running median (0, the default: off; see
        NumericChecks in holdfast/runtime.h for when a ratio misfires); a
        step that fails
        is rolled back with its data skipped (docs/gray-failures.md).
        `skip_data`: (begin, end) data positions to skip from the start, as
        a job that rolled back skipped them (summary.json's skipped_data),
        for a reference run; it needs register_data_position.

        `start_step`: the step a fresh job's registered state is at (loaded
        from a checkpoint of the trainer's own, e.g. `holdfast.dcp.load`);
        the loop goes on after it. Ignored when the job resumes from a
        holdfast checkpoint. Every worker passes the same value.

        `dcp_dir`, `dcp_every`: write the registered state as a
        torch.distributed.checkpoint to `dcp_dir/step-<s>` at the end of
        every `dcp_every`-th step and of the last one, keeping the newest
        `dcp_keep` (see holdfast.dcp). Slot 0 writes it; the directory must
        be shared on several machines. A rollback removes those of the
        steps it abandoned.
        """
        watch = str(snapshot_copy) != "between_steps"
        if dcp_every < 0 or (dcp_every > 0 and not dcp_dir) or dcp_keep < 1:
            raise InvalidArgumentError(
                f"run: dcp_every is {dcp_every} with dcp_dir {dcp_dir!r} and "
                f"dcp_keep {dcp_keep}; dcp_every >= 0 (0: off) needs a "
                "dcp_dir when set, and dcp_keep >= 1")
        if dcp_every:
            from . import dcp as dcp_io
            os.makedirs(dcp_dir, exist_ok=True)

        def step(ctx):
            for group in self._groups:
                group._begin_step()
            self._step_comm = ctx.comm  # the step's; see ProcessGroup._run
            self._in_step = True
            self._step_place = (ctx.slot, ctx.world_size)
            self._fence_checked = False
            try:
                step_fn(StepContext(ctx, self))
            except BaseException:
                self._versions = None
                raise
            finally:
                # Nothing a group issued outlives its step (a recovery
                # replaces the communicator the operations run on).
                self._ops.drain()
                self._in_step = False
                self._step_comm = None
            for group in self._groups:
                group._end_step()
            # The runtime snapshots the host copies once the copies are
            # done (state_events).
            self._device_state.copy_out()
            if dcp_every and (ctx.step % dcp_every == 0 or ctx.step == steps):
                self._device_state.wait()
                dcp_io.save(self, Communicator(ctx.comm, self._ops),
                            dcp_io.step_dir(dcp_dir, ctx.step), ctx.step)
                if ctx.slot == 0:
                    dcp_io.prune(dcp_dir, dcp_keep)
            if watch:
                self._versions = [t._version for _, t in self._watched]

        def restored(step):
            # No snapshot copied during a step survives a restore, and the
            # step that failed may have moved versions: nothing to compare.
            self._versions = None
            self._device_state.copy_in()
            if dcp_every and self.slot == 0:
                dcp_io.prune(dcp_dir, dcp_keep, after=step)
            if on_restore is not None:
                on_restore(step)

        if self._sharded and self._backend == "nccl":
            # Partitions may become host copies of CUDA shards once the
            # run has begun (mirror_shard): the runtime gets the event
            # their copies will record now.
            self._device_state.prepare(
                torch.device("cuda", torch.cuda.current_device()))
        self._running = True
        try:
            return self._rt.run(step, int(steps), int(snapshot_every),
                                metrics, restored, str(snapshot_copy),
                                [(int(b), int(e)) for b, e in skip_data],
                                float(spike_factor), int(start_step),
                                self._device_state.event_handles(),
                                standby_warmup)
        finally:
            self._running = False

    def begin_state_update(self):
        """Call in every step before the first write to registered state,
        so that the step's snapshot is copied while the next step computes
        (see run's `snapshot_copy`). Waits for the copy of the previous
        step's snapshot if one is under way (a memory copy, never the
        network); one not yet started is copied here instead, as between
        the steps.

        A registered tensor written in place since the step before ended
        makes the call too late: it reports that instead (see run), and
        this step's later calls return at once.

        A failure that a process group deferred in this step (a lost peer
        during DDP's all-reduce) is raised here, before the step writes
        registered state: the live state stays the last step's, which a
        recovery may use when every checkpoint copy of a piece is gone."""
        if self._in_step:
            self._ops.drain()
            for group in self._groups:
                if group._error is not None:
                    error, group._error = group._error, None
                    raise error
            # The step's writes to registered CUDA tensors come after the
            # copies of the last step's values.
            self._device_state.fence()
        if self._in_step and not self._fence_checked:
            self._fence_checked = True
            if self._versions is not None:
                for (name, t), v in zip(self._watched, self._versions):
                    if t._version != v:
                        self._rt.report_early_write(f"tensor '{name}'")
                        return
        self._rt.begin_state_update()

    def leave(self, finished=False):
        self._rt.leave(finished)
