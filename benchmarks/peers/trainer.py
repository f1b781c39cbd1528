#!/usr/bin/env python3
"""One training job under each fault-tolerance system, for benchmarks/peers.

The job is the DDP MLP of examples/python/ddp_train.py (the same batches,
split over the ranks, SGD with momentum), plus `--state-mb` MiB of extra
state per rank: a buffer that every step updates in place and that every
system must checkpoint (it takes no part in the all-reduce). `--step-ms`
adds compute time per step.

    --system plain      torch DDP over Gloo, no fault tolerance (torchrun)
    --system dcp        torch DDP, a torch.distributed.checkpoint every
                        --dcp-every steps, resumed after torchrun restarts
    --system nvrx       as dcp, under nvidia-resiliency-ext's ft_launcher,
                        with a rank heartbeat each step (hang detection)
    --system torchft    torchft: one replica group per process, a
                        Lighthouse, live recovery from a healthy replica
    --system holdfast   holdfast: DDP on the "holdfast" process group,
                        in-memory checkpoints, standbys (holdfast-run)

Every rank appends "<step> <unix ns>" to $PEERS_OUT/progress-<rank> when a
step completes, keeps its pid in $PEERS_OUT/pid-<rank>, and writes the hash
of its whole final state (the model, SGD's momentum and all of the extra
state) to $PEERS_OUT/final-<rank>: "<step> <sha256>"; rank 0 also to
$PEERS_OUT/final.
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from mlp_data import make_batch, make_model  # noqa: E402


class Job:
    """The model, optimizer and extra state, and what each step does."""

    def __init__(self, args):
        self.args = args
        torch.set_num_threads(1)
        self.model = make_model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05,
                                   momentum=0.9)
        for p in self.model.parameters():
            self.opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.extra = torch.zeros(args.state_mb * (1 << 20) // 4)

    def state_dict(self):
        sd = {"model": self.model.state_dict(), "optim": self.opt.state_dict()}
        if self.extra.numel():
            # Not when empty: torchft 0.2.0's HTTP checkpoint transport fails
            # on an empty tensor ("both buffer length (0) and count (-1)
            # must not be 0").
            sd["extra"] = self.extra
        return sd

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optim"])
        if self.extra.numel():
            self.extra.copy_(sd["extra"])

    def step(self, wrapped, step, rank, world, before_update=None):
        x, y = make_batch(step, self.args.batch)
        lo = self.args.batch * rank // world
        hi = self.args.batch * (rank + 1) // world
        self.opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(wrapped(x[lo:hi]), y[lo:hi])
        loss.backward()
        if self.args.step_ms > 0:
            time.sleep(self.args.step_ms / 1000)
        if before_update is not None:
            before_update()
        return loss

    def update_extra(self, step):
        if self.extra.numel():
            self.extra.add_(float(step % 7))

    def digest(self):
        """The hash of the whole state: the model, SGD's momentum (by
        parameter index) and every byte of the extra state."""
        h = hashlib.sha256()
        tensors = list(self.model.state_dict().values())
        state = self.opt.state_dict()["state"]
        tensors += [state[i]["momentum_buffer"] for i in sorted(state)]
        for t in tensors + [self.extra]:
            h.update(t.contiguous().numpy().tobytes())
        return h.hexdigest()


class Out:
    """Progress and pid files under $PEERS_OUT."""

    def __init__(self, rank):
        self.dir = os.environ["PEERS_OUT"]
        self.rank = rank
        self.progress = open(os.path.join(self.dir, f"progress-{rank}"), "a")
        with open(os.path.join(self.dir, f"pid-{rank}.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(self.dir, f"pid-{rank}.tmp"),
                   os.path.join(self.dir, f"pid-{rank}"))

    def done(self, step):
        self.progress.write(f"{step} {time.time_ns()}\n")
        self.progress.flush()

    def final(self, step, digest):
        names = [f"final-{self.rank}"] + (["final"] if self.rank == 0 else [])
        for name in names:
            tmp = os.path.join(self.dir, name + ".tmp")
            with open(tmp, "w") as f:
                f.write(f"{step} {digest}\n")
            os.replace(tmp, os.path.join(self.dir, name))


def run_plain(args, job):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Out(rank)
    ddp = torch.nn.parallel.DistributedDataParallel(job.model,
                                                    broadcast_buffers=False)
    for step in range(1, args.steps + 1):
        job.step(ddp, step, rank, world)
        job.opt.step()
        job.update_extra(step)
        out.done(step)
    out.final(args.steps, job.digest())
    dist.destroy_process_group()


def init_restartable(timeout_s):
    """init_process_group("gloo") that survives torchrun's restarts: the
    workers of every restart share the agent's store, where Gloo's
    addresses from the restart before would still be read (its full mesh
    then times out connecting to them; seen with torch 2.9.1), so each
    restart gets keys of its own."""
    from datetime import timedelta

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank = int(os.environ["RANK"])
    # torchrun's agent serves the store; under ft_launcher
    # (TORCHELASTIC_USE_AGENT_STORE=False) rank 0 does.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"],
                          int(os.environ["MASTER_PORT"]),
                          is_master=not agent and rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"restart-{restart}", store),
        rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_s))


def run_dcp(args, job, heartbeat=None):
    import torch.distributed.checkpoint as dcp

    init_restartable(args.timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Out(rank)
    root = args.dcp_dir
    start = 0
    if os.path.exists(os.path.join(root, "latest")):
        with open(os.path.join(root, "latest")) as f:
            start = int(f.read())
        sd = job.state_dict()
        dcp.load(sd, checkpoint_id=os.path.join(root, f"step-{start}"))
        job.load_state_dict(sd)
    ddp = torch.nn.parallel.DistributedDataParallel(job.model,
                                                    broadcast_buffers=False)
    for step in range(start + 1, args.steps + 1):
        job.step(ddp, step, rank, world)
        job.opt.step()
        job.update_extra(step)
        if step % args.dcp_every == 0 and step < args.steps:
            dcp.save(job.state_dict(),
                     checkpoint_id=os.path.join(root, f"step-{step}"))
            dist.barrier()
            if rank == 0:
                with open(os.path.join(root, "latest.tmp"), "w") as f:
                    f.write(str(step))
                os.replace(os.path.join(root, "latest.tmp"),
                           os.path.join(root, "latest"))
        if heartbeat is not None:
            heartbeat.send_heartbeat()
        out.done(step)
    out.final(args.steps, job.digest())
    dist.destroy_process_group()


def run_nvrx(args, job):
    """run_dcp under ft_launcher: the rank monitor that the launcher starts
    for each rank restarts the job when a rank's heartbeats stop for
    --ft-rank-heartbeat-timeout (a hang), as well as when a rank dies."""
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    run_dcp(args, job, heartbeat=client)
    client.shutdown_workload_monitoring()


def run_torchft(args, job):
    from datetime import timedelta

    import torchft

    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    out = Out(group)
    pg = torchft.ProcessGroupGloo(timeout=timedelta(seconds=args.timeout))
    manager = torchft.Manager(
        pg=pg, min_replica_size=1, load_state_dict=job.load_state_dict,
        state_dict=job.state_dict, replica_id=f"peers_{group}",
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.timeout))
    ddp = torchft.DistributedDataParallel(manager, job.model)
    while manager.current_step() < args.steps:
        step = manager.current_step() + 1
        manager.start_quorum()  # what torchft.Optimizer.zero_grad does
        job.step(ddp, step, group, groups)
        # As torchft.Optimizer.step, but knowing whether the step counted
        # (not when its all-reduce failed).
        if manager.should_commit():
            job.opt.step()
            job.update_extra(step)
            out.done(manager.current_step())
    out.final(manager.current_step(), job.digest())
    manager.shutdown()


def run_holdfast(args, job):
    import holdfast
    import holdfast.distributed as hd

    rt = holdfast.Runtime()
    rt.register_module(job.model, "model")
    rt.register_optimizer(job.opt, "sgd")
    if job.extra.numel():
        rt.register_tensor("extra", job.extra)
    hd.init_process_group(rt)
    outs = {}

    def step(ctx):
        ddp = hd.ddp(rt, job.model, broadcast_buffers=False)
        job.step(ddp, ctx.step, ctx.slot, ctx.world_size,
                 before_update=ctx.runtime.begin_state_update)
        job.opt.step()
        job.update_extra(ctx.step)
        if ctx.slot not in outs:
            outs[ctx.slot] = Out(ctx.slot)
        outs[ctx.slot].done(ctx.step)

    try:
        result = rt.run(step, args.steps,
                        snapshot_every=args.snapshot_every)
    except holdfast.CancelledError:
        return  # a standby that was never needed
    if result.slot in outs:
        outs[result.slot].final(result.final_step, job.digest())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", required=True,
                    choices=["plain", "dcp", "nvrx", "torchft",
                             "holdfast"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--state-mb", type=int, default=0)
    ap.add_argument("--dcp-dir", default="")
    ap.add_argument("--dcp-every", type=int, default=20)
    ap.add_argument("--snapshot-every", type=int, default=1,
                    help="holdfast: an in-memory snapshot every k steps")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="torchft's operation and quorum timeout, and the "
                    "collective timeout of the dcp and nvrx jobs, s")
    args = ap.parse_args()
    job = Job(args)
    {"plain": run_plain, "dcp": run_dcp, "nvrx": run_nvrx,
     "torchft": run_torchft, "holdfast": run_holdfast}[args.system](args, job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
