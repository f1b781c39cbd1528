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

One copy of the shards on the CPU: FSDP's shard of each parameter, and
SGD's momentum of it, live in the runtime's memory of the registered
partition (fully_shard allocates its own; the example points FSDP at the
partition before the first step, and drops FSDP's). optimizer.step()
updates the registered state in place (behind begin_state_update()), and
a restore writes into FSDP's shards: nothing is copied in either
direction. On a GPU (--device cuda) the partitions are the host copies
of FSDP's device shards (Runtime.mirror_shard): each step's end starts
copying the new shards into them while the next step computes, and a
restore copies them back; the device holds one copy. FSDP is built once
this process has a slot (a standby builds it when it takes one, after
its partition was restored).

Each rank prints one line at the end, with the hash of the whole state
(every parameter and momentum shard, gathered, and the data position):
    final step=<N> world=<W> params_sha256=<hex>
Exit codes as ddp_train.py's: 0 done (also a standby that was never
needed), 3 fenced, 4 the job stopped, 1 any other error.
"""

import argparse
import hashlib
import sys
import time

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import holdfast
import holdfast.distributed as hd
import example_run
from fsdp_state import ShardedTensor, adopt_partitions
from mlp_data import make_batch, tensor_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model trains: cpu (Gloo) or cuda (NCCL)")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="extra compute per step, in ms (a sleep)")
    args = ap.parse_args()
    if args.steps < 0 or args.batch < 1 or args.step_ms < 0:
        ap.error("--steps and --step-ms must be >= 0 and --batch >= 1")

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
    # The partitions are host memory: FSDP's shards on the CPU are them;
    # on a GPU, FSDP's shards (the only device copy) are copied to them.
    in_place = device.type == "cpu"

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
            if in_place:
                adopt_partitions(model, names, params)
            opt = torch.optim.SGD(model.parameters(), lr=args.lr,
                                  momentum=0.9)
            pairs = []
            for n, p in zip(names, model.parameters()):
                if in_place:
                    local, _ = momenta[n].local_view(p.to_local().shape[0])
                    momentum = DTensor.from_local(
                        local, p.device_mesh, p.placements, run_check=False,
                        shape=p.shape, stride=p.stride())
                else:
                    momentum = torch.zeros_like(p)
                opt.state[p]["momentum_buffer"] = momentum
                pairs.append((params[n], p))
                pairs.append((momenta[n], momentum))
            if not in_place:
                # The partitions become the host copies of the device
                # shards (and fill them now).
                for state, tensor in pairs:
                    rt.mirror_shard(state.name, tensor.to_local())
            built["opt"], built["pairs"] = opt, pairs
            built["locals"] = [t.to_local().data_ptr() for _, t in pairs]
        return built["opt"]

    def restored(step):
        fsdp()  # a restore writes the mirrored device shards itself

    def check_in_place():
        """Every shard FSDP and SGD use is still the registered partition
        on the CPU, or the device tensor it mirrors on a GPU (the runtime
        moves partitions only after a shrink)."""
        for (state, tensor), ptr in zip(built["pairs"], built["locals"]):
            if (not state.in_place(tensor.to_local()) if in_place
                    else tensor.to_local().data_ptr() != ptr):
                raise RuntimeError(
                    f"fsdp_train: '{state.name}' is no longer FSDP's shard")

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
        check_in_place()
        x, y = make_batch(int(data_pos[0]) + 1, args.batch)
        x, y = x.to(device), y.to(device)
        lo = args.batch * ctx.slot // ctx.world_size
        hi = args.batch * (ctx.slot + 1) // ctx.world_size
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi])
        loss.backward()
        if args.step_ms > 0:
            time.sleep(args.step_ms / 1000)
        last_grad_norm[0] = float(torch.norm(torch.stack(
            [p.grad.to_local().norm() for p in model.parameters()])))
        ctx.runtime.begin_state_update()  # the first write comes next
        opt.step()
        data_pos.add_(1)
        last_loss[0] = float(loss.detach())
        if ctx.step == args.steps:
            # The runtime's communicator ends with run(): the full model's
            # hash is taken in the last step (on a GPU, the partitions get
            # this step's shards first: the runtime's copy comes after it).
            # Parameters, then momentum, then the data position.
            if not in_place:
                with torch.no_grad():
                    for state, tensor in built["pairs"]:
                        state.save(tensor.to_local())
            digest = hashlib.sha256()
            for state in [params[n] for n in names] + [momenta[n] for n in names]:
                digest.update(tensor_bytes(state.gather_full(ctx.comm, device)))
            digest.update(tensor_bytes(data_pos))
            final_hash[0] = digest.hexdigest()

    result, code = example_run.run("fsdp_train", lambda: rt.run(
        step, args.steps, on_restore=restored,
        metrics=lambda: {"loss": last_loss[0], "grad_norm": last_grad_norm[0]}))
    if result is None:
        return code

    # Every step checked that FSDP's and SGD's shards are the partitions.
    if in_place:
        print(f"shards_in_place={len(built['pairs'])}", file=sys.stderr)
    example_run.report(result, last_loss[0], final_hash[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
