#!/usr/bin/env python3
"""A deterministic PyTorch trainer in two dimensions on holdfast: pipeline
parallelism (2 stages) x data parallelism (DDP), on a 2 x W/2 device mesh.

The MLP of fsdp_train.py (16 -> 32 tanh -> 32 tanh -> 1) is cut in two
stages: stage 0 (16 -> 32 tanh) on the mesh's first row of slots, stage 1
(32 -> 32 tanh -> 1, and the loss) on the second. Slot s is stage
s // (W/2), data-parallel replica s % (W/2):

    mesh = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("pp", "dp"))

Each step, every replica takes its rows of the batch; stage 0 sends its
activations to its stage 1 peer over the "pp" group, stage 1 returns
their gradient, and each stage's DDP averages its gradients over the "dp"
group. Both groups are subgroups of the holdfast process group: after a
recovery they hold the same slots in the same roles.

Each slot's state (its stage's parameters and momentum) is one partition
of a sharded array, so a standby that takes a slot gets that stage's
state from buddies. The world size must stay the same: run the job with
standbys (a shrink stops it with an error that says so).

    holdfast-run -n 4 --standby 1 --inject kill:slot=1:step=12 -- \\
        .venv/bin/python3 examples/python/pp_ddp_train.py --steps 30

Each rank prints one line at the end, with the hash of both stages'
parameters and momentum, every slot's copy, and the data position:
    final step=<N> world=<W> params_sha256=<hex>
Exit codes as ddp_train.py's.
"""

import argparse
import hashlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import holdfast
import holdfast.distributed as hd
import example_run
from mlp_data import make_batch, tensor_bytes

HIDDEN = 32


def make_stages():
    torch.manual_seed(12345)
    first = torch.nn.Sequential(torch.nn.Linear(16, HIDDEN), torch.nn.Tanh())
    second = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN),
                                 torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))
    return first, second


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    if args.steps < 0 or args.batch < 1:
        ap.error("--steps must be >= 0 and --batch >= 1")
    torch.set_num_threads(1)

    try:
        rt = holdfast.Runtime()
    except holdfast.HoldfastError as e:
        print(f"pp_ddp_train: {e}", file=sys.stderr)
        return 1
    world = rt.world_size
    if world < 2 or world % 2:
        print(f"pp_ddp_train: a world of {world} slots; 2 stages need an "
              "even number", file=sys.stderr)
        return 1
    replicas = world // 2
    stages = make_stages()
    # Every slot's partition holds the larger stage's parameters and
    # momentum; a stage 0 slot leaves the rest zero.
    chunk = 2 * max(sum(p.numel() for p in s.parameters()) for s in stages)
    rt.register_sharded_state("stage", world * chunk, torch.float32, chunk)
    data_pos = torch.zeros(1, dtype=torch.int64)
    rt.register_data_position("data_pos", data_pos)
    hd.init_process_group(rt)

    built = {}

    def setup():
        """The mesh, this slot's stage and its optimizer, built on the
        first call (this process has a slot by then)."""
        if not built:
            mesh = init_device_mesh("cpu", (2, replicas),
                                    mesh_dim_names=("pp", "dp"))
            stage_index = mesh.get_coordinate()[0]
            module = stages[stage_index]
            opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
            tensors = list(module.parameters())
            for p in module.parameters():
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
                tensors.append(opt.state[p]["momentum_buffer"])
            built.update(mesh=mesh, stage=stage_index, module=module, opt=opt,
                         tensors=tensors, pp=mesh.get_group("pp"),
                         dp=mesh.get_group("dp"))
        return built

    def save():
        flat = rt.shard("stage")
        offset = 0
        for t in built["tensors"]:
            flat[offset:offset + t.numel()].copy_(t.detach().reshape(-1))
            offset += t.numel()

    def load():
        flat = rt.shard("stage")
        offset = 0
        with torch.no_grad():
            for t in built["tensors"]:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    if not rt.standby:
        setup()
        rt.shard("stage").zero_()
        save()

    last_loss = [0.0]
    final_hash = [None]

    def step(ctx):
        b = setup()
        if ctx.world_size != world:
            raise RuntimeError(
                f"pp_ddp_train: the world shrank from {world} to "
                f"{ctx.world_size} slots; a device mesh needs a world of a "
                "fixed size: run it with standbys")
        ddp = hd.ddp(rt, b["module"], process_group=b["dp"])
        x, y = make_batch(int(data_pos[0]) + 1, args.batch)
        replica = b["dp"].rank()
        lo = args.batch * replica // replicas
        hi = args.batch * (replica + 1) // replicas
        b["opt"].zero_grad(set_to_none=False)
        if b["stage"] == 0:
            h = ddp(x[lo:hi])
            dist.send(h.detach(), group=b["pp"], group_dst=1)
            grad = torch.empty_like(h)
            dist.recv(grad, group=b["pp"], group_src=1)
            h.backward(grad)
        else:
            h = torch.empty(hi - lo, HIDDEN)
            dist.recv(h, group=b["pp"], group_src=0)
            h.requires_grad_()
            loss = torch.nn.functional.mse_loss(ddp(h), y[lo:hi])
            loss.backward()
            dist.send(h.grad, group=b["pp"], group_dst=0)
            last_loss[0] = float(loss.detach())
        ctx.runtime.begin_state_update()  # the first write comes next
        b["opt"].step()
        save()
        data_pos.add_(1)
        if ctx.step == args.steps:
            # Every slot's partition (both stages, every replica's copy).
            shard = rt.shard("stage")
            full = torch.empty(shard.numel() * ctx.world_size)
            ctx.comm.all_gather(full, shard)
            parts = full.view(2, replicas, -1)
            if not all(torch.equal(parts[s, 0], parts[s, r])
                       for s in range(2) for r in range(replicas)):
                raise RuntimeError("pp_ddp_train: the data-parallel replicas "
                                   "of a stage differ")
            digest = hashlib.sha256(tensor_bytes(full))
            digest.update(tensor_bytes(data_pos))
            final_hash[0] = digest.hexdigest()

    result, code = example_run.run("pp_ddp_train", lambda: rt.run(
        step, args.steps, on_restore=lambda step: (setup(), load()),
        metrics=lambda: {"loss": last_loss[0]}))
    if result is None:
        return code
    example_run.report(result, last_loss[0], final_hash[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
