"""A holdfast job's registered state as a torch.distributed.checkpoint (DCP).

One logical tensor per registered name: a replicated tensor as registered,
a sharded array whole (its partitions put together, flat), and the step
under "holdfast.step". Plain torch reads it without holdfast:

    import torch.distributed.checkpoint as dcp
    sd = {"model.0.weight": torch.empty(32, 16), ...}
    dcp.load(sd, checkpoint_id="ckpt/step-30", no_dist=True)

`Runtime.run(..., dcp_dir=D, dcp_every=N)` writes D/step-<s> every N steps
(and at the last step); `load(runtime, path)` reads one into the
registered state before run(), and returns its step for run's
`start_step`, so that a job starts from a DCP checkpoint (one that plain
torch wrote included: it needs a tensor per registered name, and
"holdfast.step" is optional).
"""

import os
import shutil

import torch
import torch.distributed.checkpoint as _dcp

from .errors import InvalidArgumentError

STEP_KEY = "holdfast.step"
_PREFIX = "step-"


def step_dir(root, step):
    return os.path.join(root, f"{_PREFIX}{int(step)}")


def steps_in(root):
    """The steps of the complete checkpoints under `root`, ascending."""
    if not os.path.isdir(root):
        return []
    found = []
    for entry in os.listdir(root):
        if entry.startswith(_PREFIX) and entry[len(_PREFIX):].isdigit():
            if os.path.exists(os.path.join(root, entry, ".metadata")):
                found.append(int(entry[len(_PREFIX):]))
    return sorted(found)


def _replicated(runtime):
    return [(name, t.data if isinstance(t, torch.nn.Parameter) else t)
            for name, t in runtime._watched]


def save(runtime, comm, path, step):
    """Writes the registered state as one DCP checkpoint at `path`.

    Collective: every slot calls it at the same point of the same step
    (on that step's `comm`); slot 0 gathers the sharded arrays' partitions
    and writes, into a temporary directory that it renames to `path` once
    complete. An existing `path` is replaced."""
    gathered = {}
    for name, (dtype, numel) in runtime._sharded.items():
        part = runtime.shard(name, dtype)
        mine = torch.tensor([part.holdfast_offset, part.numel()],
                            dtype=torch.int64)
        places = torch.empty(2 * comm.size, dtype=torch.int64)
        comm.all_gather(places, mine)
        if comm.rank == 0:
            whole = torch.empty(numel, dtype=dtype)
            whole[part.holdfast_offset:part.holdfast_offset + part.numel()] = part
            for r in range(1, comm.size):
                offset, count = int(places[2 * r]), int(places[2 * r + 1])
                if count:
                    comm.recv(whole[offset:offset + count], r, tag=7)
            gathered[name] = whole
        elif part.numel():
            comm.send(part, 0, tag=7)
    if comm.rank != 0:
        return
    state = {name: t for name, t in _replicated(runtime)}
    state.update(gathered)
    state[STEP_KEY] = torch.tensor([int(step)], dtype=torch.int64)
    tmp = f"{path}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _dcp.save(state, checkpoint_id=tmp, no_dist=True)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)


def load(runtime, path):
    """Reads a DCP checkpoint into the registered state (in place); returns
    its step ("holdfast.step", 0 if it has none). Call it on every process
    before run(), and pass the step as run's `start_step`. A registered
    name the checkpoint lacks, or holds with another shape or dtype, raises
    InvalidArgumentError naming it."""
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise InvalidArgumentError(
            f"holdfast.dcp.load: {path} is not a DCP checkpoint (no .metadata)")
    meta = _dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = {}
    for name, tensor in _replicated(runtime):
        _check(meta, name, tensor.shape, tensor.dtype, path)
        state[name] = tensor
    wholes = {}
    for name, (dtype, numel) in runtime._sharded.items():
        _check(meta, name, torch.Size([numel]), dtype, path)
        wholes[name] = state[name] = torch.empty(numel, dtype=dtype)
    step = torch.zeros(1, dtype=torch.int64)
    if STEP_KEY in meta:
        state[STEP_KEY] = step
    _dcp.load(state, checkpoint_id=path, no_dist=True)
    for name, (dtype, _) in runtime._sharded.items():
        part = runtime.shard(name, dtype)
        offset = part.holdfast_offset
        part.copy_(wholes[name][offset:offset + part.numel()])
    return int(step[0])


def _check(meta, name, shape, dtype, path):
    entry = meta.get(name)
    if entry is None:
        raise InvalidArgumentError(
            f"holdfast.dcp.load: {path} has no tensor '{name}' (registered "
            "state)")
    props = getattr(entry, "properties", None)
    have_dtype = getattr(props, "dtype", None)
    if not hasattr(entry, "size") or (
            tuple(entry.size) != tuple(shape) or have_dtype not in (None, dtype)):
        raise InvalidArgumentError(
            f"holdfast.dcp.load: '{name}' in {path} is "
            f"{tuple(getattr(entry, 'size', ()))} {have_dtype}; the registered "
            f"state is {tuple(shape)} {dtype}")


def prune(root, keep, after=None):
    """Removes checkpoints under `root`: all but the newest `keep`, and
    those of steps after `after` (a timeline a rollback abandoned)."""
    steps = steps_in(root)
    drop = [s for s in steps if after is not None and s > after]
    kept = [s for s in steps if s not in drop]
    drop += kept[:-keep] if keep > 0 and len(kept) > keep else []
    for s in drop:
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
