"""What the FSDP2 examples (fsdp_train.py, gpt_train.py --parallel fsdp2)
share: a tensor of the model as holdfast sharded state in FSDP's layout,
and FSDP's shards pointed at the registered partitions (one copy on the
CPU).

Layout: fully_shard cuts a parameter's dim 0 into chunks of ceil(rows / W)
rows on a world of W, slot s holding chunk s (the last ones shorter or
empty). Each tensor is registered as a sharded array of W such chunks,
each padded to full length, one unit per slot, so holdfast's partition
of it is FSDP's. The world size must therefore stay the same."""

import torch


class ShardedTensor:
    """One of the model's tensors (a parameter or its momentum) as holdfast
    sharded state in FSDP's layout on a world of `world` slots."""

    def __init__(self, rt, name, full, world):
        self.rt, self.name = rt, name
        self.rows = full.shape[0]
        self.shape = tuple(full.shape)
        self.row_numel = full.numel() // self.rows
        self.chunk_rows = -(-self.rows // world)
        chunk = self.chunk_rows * self.row_numel
        rt.register_sharded_state(name, world * chunk, full.dtype, chunk)

    def fill_from_full(self, full, slot):
        """This slot's chunk of the full tensor (a fresh start)."""
        lo = slot * self.chunk_rows
        part = full.detach().reshape(self.rows, -1)[lo:lo + self.chunk_rows]
        shard = self.rt.shard(self.name)
        shard.zero_()
        shard[:part.numel()].copy_(part.reshape(-1))

    def local_view(self, rows):
        """The partition as FSDP's local shard of `rows` rows (a view of
        the runtime's memory), and its padded form."""
        padded = self.rt.shard(self.name).view(self.chunk_rows, -1)
        shape = (self.chunk_rows,) + self.shape[1:]
        padded = padded.view(shape)
        return padded.narrow(0, 0, rows), padded

    def save(self, local):
        self.rt.shard(self.name)[:local.numel()].copy_(local.reshape(-1))

    def in_place(self, local):
        """Whether `local` (a local shard) is a view of the partition."""
        return (local.untyped_storage().data_ptr() ==
                self.rt.shard(self.name).untyped_storage().data_ptr())

    def gather_full(self, comm, device):
        """The full tensor, from every slot's chunk (flat), on `device`
        (the communicator's memory)."""
        shard = self.rt.shard(self.name).to(device)
        out = torch.empty(shard.numel() * comm.size, dtype=shard.dtype,
                          device=device)
        comm.all_gather(out, shard)
        return out[:self.rows * self.row_numel].cpu()


def adopt_partitions(model, names, params):
    """Points every FSDP shard of `model` (fully_shard applied, before its
    first forward) at its registered partition, without copying: the
    partition holds the state to train from (filled on a fresh start,
    restored on a standby). FSDP's own shard storage is dropped. torch's
    FSDP2 keeps a shard as a padded flat tensor and the parameter's local
    tensor as a view of it; both become views of the partition, so its
    lazy initialisation finds them the same storage and keeps them."""
    by_param = {id(p): n for n, p in zip(names, model.parameters())}
    adopted = 0
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        for fsdp_param in group.fsdp_params if group is not None else ():
            name = by_param[id(fsdp_param.sharded_param)]
            local = fsdp_param.sharded_param._local_tensor
            view, padded = params[name].local_view(local.shape[0])
            if tuple(padded.shape) != tuple(fsdp_param.padded_sharded_param_size):
                raise RuntimeError(
                    f"FSDP pads '{name}' to "
                    f"{tuple(fsdp_param.padded_sharded_param_size)}, the "
                    f"partition holds {tuple(padded.shape)}")
            fsdp_param._sharded_param_data = padded.view(-1)
            fsdp_param.sharded_param._local_tensor = view
            adopted += 1
    if adopted != len(names):
        raise RuntimeError(f"{adopted} of {len(names)} FSDP "
                           "shards found")
