#!/usr/bin/env python3
"""A deterministic PyTorch FSDP2 trainer on holdfast (CPU on Gloo, or CUDA on NCCL).

An MLP (16 -> 32 tanh -> 32 tanh -> 1) fitted with SGD and momentum to the
target function of ddp_train.py, on the same batches, sharded with
torch.distributed.fsdp.fully_shard over the "holdfast" process group:
each slot holds one shard of every parameter and of its momentum. The
shards are registered with the runtime as sharded state, so it snapshots
them every step and copies them to buddies in other failure domains; a
standby that takes a slot gets that slot's shards from them, and a run
with a fault ends with exactly the bytes of the fault-free run.

    holdfast-run -n 3 --standby 1 --inject kill:slot=1:step=20 -- \\
        .venv/bin/python3 examples/python/fsdp_train.py --steps 40

Layout: fully_shard cuts a parameter's dim 0 into chunks of ceil(rows / W)
rows on a world of W, slot s holding chunk s (the last ones shorter or
empty). Each parameter and momentum is registered as a sharded array of W
such chunks, each padded to full length, one unit per slot, so holdfast's
partition of it is FSDP's. The world size must therefore stay the same:
run the job with standbys. A shrink would re-chunk FSDP's shards, which
this example does not do; it stops the run with an error that says so.

FSDP's shards and the registered ones are separate buffers: each step
copies its new shards in after optimizer.step() (behind
begin_state_update()), and a restore copies them back out. FSDP is built
once this process has a slot (a standby builds it when it takes one).

Each rank prints one line at the end, with the hash of the full model:
    final step=<N> world=<W> params_sha256=<hex>
Exit codes as ddp_train.py's: 0 done (also a standby that was never
needed), 3 fenced, 4 the job stopped, 1 any other error.
"""

import argparse
import hashlib
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import holdfast
import holdfast.distributed as hd
import example_run
from mlp_data import make_batch, tensor_bytes


class ShardedTensor:
    """One of the model's tensors (a parameter or its momentum) as holdfast
    sharded state in FSDP's layout on a world of `world` slots."""

    def __init__(self, rt, name, full, world):
        self.rt, self.name = rt, name
        self.rows = full.shape[0]
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

    def save(self, local):
        self.rt.shard(self.name)[:local.numel()].copy_(local.reshape(-1))

    def load(self, local):
        local.copy_(self.rt.shard(self.name)[:local.numel()].view_as(local))

    def gather_full(self, comm, device):
        """The full tensor, from every slot's chunk (flat), on `device`
        (the communicator's memory)."""
        shard = self.rt.shard(self.name).to(device)
        out = torch.empty(shard.numel() * comm.size, dtype=shard.dtype,
                          device=device)
        comm.all_gather(out, shard)
        return out[:self.rows * self.row_numel].cpu()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model trains: cpu (Gloo) or cuda (NCCL)")
    args = ap.parse_args()
    if args.steps < 0 or args.batch < 1:
        ap.error("--steps must be >= 0 and --batch >= 1")

    torch.set_num_threads(1)
    device, options = example_run.device(args.device)
    torch.manual_seed(12345)
    linears = [torch.nn.Linear(16, 32), torch.nn.Linear(32, 32),
               torch.nn.Linear(32, 1)]
    model = torch.nn.Sequential(linears[0], torch.nn.Tanh(), linears[1],
                                torch.nn.Tanh(), linears[2])

    try:
        rt = holdfast.Runtime(**options)
    except holdfast.HoldfastError as e:
        print(f"fsdp_train: {e}", file=sys.stderr)
        return 1
    world = rt.world_size
    names = [name for name, _ in model.named_parameters()]
    params = {n: ShardedTensor(rt, f"model.{n}", p, world)
              for n, p in model.named_parameters()}
    momenta = {n: ShardedTensor(rt, f"sgd.{n}.momentum", p, world)
               for n, p in model.named_parameters()}
    if not rt.standby:
        for n, p in model.named_parameters():
            params[n].fill_from_full(p, rt.slot)
            momenta[n].fill_from_full(torch.zeros_like(p), rt.slot)
    data_pos = torch.zeros(1, dtype=torch.int64)
    rt.register_data_position("data_pos", data_pos)
    hd.init_process_group(rt)

    built = {}

    def fsdp():
        """The sharded model and its optimizer, built on the first call
        (this process has a slot by then)."""
        if not built:
            if rt.world_size != world:
                raise RuntimeError(
                    f"fsdp_train: the world is {rt.world_size} slots, not "
                    f"{world}; this example keeps FSDP's shards on a world "
                    "of a fixed size: run it with standbys")
            model.to(device)
            mesh = init_device_mesh(device.type, (world,))
            for layer in linears:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.SGD(model.parameters(), lr=args.lr,
                                  momentum=0.9)
            pairs = []
            for n, p in zip(names, model.parameters()):
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
                pairs.append((params[n], p))
                pairs.append((momenta[n], opt.state[p]["momentum_buffer"]))
            built["opt"], built["pairs"] = opt, pairs
        return built["opt"]

    def restored(step):
        fsdp()
        with torch.no_grad():
            for state, tensor in built["pairs"]:
                state.load(tensor.to_local())

    last_loss = [0.0]
    last_grad_norm = [0.0]
    final_hash = [None]

    def step(ctx):
        opt = fsdp()
        if ctx.world_size != world:
            raise RuntimeError(
                f"fsdp_train: the world shrank from {world} to "
                f"{ctx.world_size} slots; this example needs a world of a "
                "fixed size: run it with standbys")
        x, y = make_batch(int(data_pos[0]) + 1, args.batch)
        x, y = x.to(device), y.to(device)
        lo = args.batch * ctx.slot // ctx.world_size
        hi = args.batch * (ctx.slot + 1) // ctx.world_size
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi])
        loss.backward()
        last_grad_norm[0] = float(torch.norm(torch.stack(
            [p.grad.to_local().norm() for p in model.parameters()])))
        ctx.runtime.begin_state_update()  # the first write comes next
        opt.step()
        with torch.no_grad():
            for state, tensor in built["pairs"]:
                state.save(tensor.to_local())
        data_pos.add_(1)
        last_loss[0] = float(loss.detach())
        if ctx.step == args.steps:
            # The runtime's communicator ends with run(): the full model's
            # hash is taken in the last step.
            digest = hashlib.sha256()
            for n in names:
                digest.update(tensor_bytes(
                    params[n].gather_full(ctx.comm, device)))
            final_hash[0] = digest.hexdigest()

    result, code = example_run.run("fsdp_train", lambda: rt.run(
        step, args.steps, on_restore=restored,
        metrics=lambda: {"loss": last_loss[0], "grad_norm": last_grad_norm[0]}))
    if result is None:
        return code

    example_run.report(result, last_loss[0], final_hash[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
