"""Collectives of a subgroup (torch.distributed's new_group, split_group and
DeviceMesh dimensions) on the world communicator of the running generation,
and the calls torch.distributed has beyond the communicator's own (reduce,
gather, scatter, uneven all_to_all), for the world and for subgroups.

A subgroup names world slots, so every generation that keeps those slots
(a standby takes a lost slot's place) has the same subgroup, with the same
ranks in the same roles, and nothing is rebuilt: each call runs on the
world communicator of its step. Its messages are point-to-point operations
of that communicator, with its deadlines and traces and the diagnosis of
their peers; they carry the group's own tag, so no two groups' messages
(nor a user's send) are ever paired.

A subgroup's reductions fold the members' buffers in group rank order, 0
first, so they are deterministic; they move (size - 1) buffers per rank,
which suits the small groups of a device mesh."""

import zlib

import torch

from .errors import InvalidArgumentError

# Tags of the world group's point-to-point collectives below (a user's
# send and recv use small tags): one per kind of call, so a call never
# pairs with another kind's message.
_WORLD_TAG = 0x7FFF0000
TAG_GATHER, TAG_SCATTER, TAG_ALL_TO_ALL = 1, 2, 3


def group_tag(ranks):
    """The tag of a subgroup's messages: the same for the same world slots
    on every rank, apart from _WORLD_TAG's and from small user tags."""
    return 0x40000000 | (zlib.crc32(",".join(map(str, ranks)).encode()) &
                         0x3FFF0000)


def wait_all(posted):
    """Waits for every posted operation; raises the first one's error
    once all ended (no buffer is freed under an operation in flight)."""
    error = None
    for p in posted:
        try:
            p.wait()
        except Exception as e:  # noqa: BLE001 -- the first one is raised
            error = error or e
    if error is not None:
        raise error


def fold(parts, op):
    """parts[0] op parts[1] op ... in that order, as the C++ reductions do
    (an average truncates toward zero on integers)."""
    acc = parts[0].clone()
    boolean = acc.dtype == torch.bool
    for p in parts[1:]:
        if op == "sum" or op == "average":
            acc = torch.logical_or(acc, p) if boolean else acc.add_(p)
        elif op == "product":
            acc = torch.logical_and(acc, p) if boolean else acc.mul_(p)
        elif op == "min":
            acc = torch.minimum(acc, p)
        elif op == "max":
            acc = torch.maximum(acc, p)
        else:
            raise InvalidArgumentError(f"unknown reduce op {op!r}")
    if op == "average":
        if boolean:
            raise InvalidArgumentError("an average of bool is not defined")
        if acc.is_floating_point() or acc.is_complex():
            acc.div_(len(parts))
        else:
            acc = torch.div(acc, len(parts), rounding_mode="trunc")
    return acc


class SubComm:
    """The collectives of the world slots `ranks` (sorted, this slot among
    them) on `world`, a runtime Communicator of the step's generation;
    rank and size are the group's."""

    def __init__(self, world, ranks, tag):
        bad = [r for r in ranks if r >= world.size]
        if bad:
            raise InvalidArgumentError(
                f"subgroup {ranks}: slots {bad} are not in this generation "
                f"of {world.size} slots (a shrink removed them); a job with "
                "subgroups needs a standby for every slot it may lose")
        if world.rank not in ranks:
            raise InvalidArgumentError(
                f"subgroup {ranks}: slot {world.rank} is not a member")
        self._world = world
        self._ranks = ranks
        self._tag = tag
        self.rank = ranks.index(world.rank)
        self.size = len(ranks)
        self.device_memory = world.device_memory

    def post_send(self, tensor, peer, tag=0):
        return self._world.post_send(tensor, self._ranks[peer], self._tag + tag)

    def post_recv(self, tensor, peer, tag=0):
        return self._world.post_recv(tensor, self._ranks[peer], self._tag + tag)

    def recv(self, tensor, peer, tag=0):
        self.post_recv(tensor, peer, tag).wait()

    def all_gather(self, output, input):
        """`output` holds size blocks of input.numel(), rank r's at r."""
        n = input.numel()
        if output.numel() != n * self.size:
            raise InvalidArgumentError(
                f"all_gather: the output holds {output.numel()} elements, "
                f"{n * self.size} expected")
        src = input.reshape(-1)
        exchange(self, [src] * self.size, list(output.view(self.size, n)), 0)
        return output

    def all_reduce(self, tensor, op="sum"):
        flat = tensor.view(-1)
        gathered = torch.empty(self.size * flat.numel(), dtype=tensor.dtype,
                               device=tensor.device)
        self.all_gather(gathered, flat)
        flat.copy_(fold(list(gathered.view(self.size, -1)), op))
        return tensor

    def broadcast(self, tensor, root=0):
        if self.rank == root:
            wait_all([self.post_send(tensor, peer) for peer in range(self.size)
                      if peer != root])
        else:
            self.recv(tensor, root)
        return tensor

    def reduce_scatter(self, output, input, op="sum"):
        """`input` holds size blocks of output.numel()."""
        n = output.numel()
        if input.numel() != n * self.size:
            raise InvalidArgumentError(
                f"reduce_scatter: the input holds {input.numel()} elements, "
                f"{n * self.size} expected")
        parts = torch.empty(self.size, n, dtype=output.dtype,
                            device=output.device)
        exchange(self, list(input.reshape(self.size, n)), list(parts), 0)
        output.view(-1).copy_(fold(list(parts), op))
        return output

    def all_to_all(self, output, input):
        exchange(self, [b for b in input.view(self.size, -1)],
                 [b for b in output.view(self.size, -1)], 0)
        return output

    def barrier(self):
        self.all_reduce(torch.zeros(1, dtype=torch.uint8,
                                    device="cuda" if self.device_memory
                                    else "cpu"))


def _tag(comm, kind):
    # A subgroup's own tag is added by its post_send; the world's calls
    # get one of their own.
    return kind if isinstance(comm, SubComm) else _WORLD_TAG + kind


def exchange(comm, sends, recvs, kind):
    """Sends sends[peer] to every other rank and receives recvs[peer] from
    it (contiguous tensors; an empty one is skipped on both sides, which
    agree on its size); this rank's own block is copied. For all_to_all
    with uneven blocks, gather and scatter."""
    tag = _tag(comm, kind)
    posted = []
    for peer in range(comm.size):
        if peer == comm.rank:
            continue
        if sends[peer] is not None and sends[peer].numel():
            posted.append(comm.post_send(sends[peer], peer, tag))
        if recvs[peer] is not None and recvs[peer].numel():
            posted.append(comm.post_recv(recvs[peer], peer, tag))
    me = comm.rank
    if sends[me] is not None and recvs[me] is not None:
        recvs[me].copy_(sends[me])
    wait_all(posted)


def reduce(comm, tensor, op, root):
    """`tensor` reduced into rank `root`'s; the others' stay as they were."""
    work = tensor.contiguous().clone()
    comm.all_reduce(work, op)
    if comm.rank == root:
        tensor.copy_(work)


def check_blocks(what, blocks, like, n=None):
    """InvalidArgumentError unless `blocks` are `n` tensors (when given) of
    `like`'s element count and dtype."""
    if n is not None and len(blocks) != n:
        raise InvalidArgumentError(f"{what}: {len(blocks)} tensors for {n} ranks")
    for r, t in enumerate(blocks):
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise InvalidArgumentError(
                f"{what}: block {r} holds {t.numel()} x {t.dtype}, "
                f"{like.numel()} x {like.dtype} expected (every rank's "
                "block has the size and dtype of this rank's tensor)")


def gather(comm, outputs, input, root):
    """Rank `root` receives every rank's `input` into outputs[r]."""
    n = comm.size
    sends = [None] * n
    sends[root] = input.contiguous()
    recvs = [None] * n
    if comm.rank == root:
        check_blocks("gather", outputs, input, n)
        recvs = [o.contiguous() for o in outputs]
    exchange(comm, sends, recvs, TAG_GATHER)
    if comm.rank == root:
        for o, r in zip(outputs, recvs):
            if r is not o:
                o.copy_(r)


def scatter(comm, output, inputs, root):
    """Rank r receives rank `root`'s inputs[r] into `output`."""
    n = comm.size
    work = output.contiguous()
    sends = [None] * n
    recvs = [None] * n
    recvs[root] = work
    if comm.rank == root:
        check_blocks("scatter", inputs, output, n)
        sends = [t.contiguous() for t in inputs]
    exchange(comm, sends, recvs, TAG_SCATTER)
    if work is not output:
        output.copy_(work)
