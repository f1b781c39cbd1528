#!/usr/bin/env python3
"""A deterministic PyTorch DDP trainer on holdfast (CPU on Gloo, or CUDA on NCCL).

A small MLP (16 -> 32 tanh -> 1) fitted with SGD and momentum to a fixed
target function. Batch k is generated from a seed of k; the next batch's
index is the registered data position (batch k at step k unless batches
are skipped after a numeric anomaly, or with --skip-data). It is split
evenly over the slots, and DistributedDataParallel averages the
gradients over the "holdfast" process group. The model and the optimizer's
momentum are registered with the runtime, which snapshots them every step
and restores them after a failure, so a run with a fault in replace mode
ends with exactly the bytes of the fault-free run. Each step fences its
writes (begin_state_update() before opt.step()), so the snapshot of the
step before is copied while the forward and backward passes run.

    holdfast-run -n 2 --standby 1 --inject kill:slot=1:step=20 -- \\
        .venv/bin/python3 examples/python/ddp_train.py --steps 40

With --device cuda the model, its momentum and the batches live on the
GPU (HOLDFAST_DEVICE, else LOCAL_RANK, else 0), the runtime's
communicator is NCCL's, and the registered CUDA tensors are snapshotted
through pinned host copies. Several ranks may share one GPU (give each
process its own NCCL_HOSTID; see scripts/gpu_check.sh).

Each rank prints one line at the end, with the hash of its whole state
(parameters, SGD's momentum, the data position; mlp_data.state_sha256):
    final step=<N> world=<W> params_sha256=<hex>
Exit codes: 0 done (also a standby that was never needed), 3 fenced, 4 the
job stopped, 1 any other error.
"""

import argparse
import random
import sys
import time

import torch

import holdfast
import holdfast.dcp
import holdfast.distributed as hd
import example_run
from mlp_data import make_batch, make_model, state_sha256


def step_scale(sigma, step, slot):
    """--uneven: the step's compute as a multiple of --step-ms. The draw is
    the step's (the same on every slot: it is the batch that is long),
    with 5 % noise of the slot's own; 1 without --uneven."""
    if sigma <= 0:
        return 1.0
    draw = random.Random(step)
    scale = draw.lognormvariate(-sigma * sigma / 2, sigma)
    if draw.random() < 0.05:
        scale = 5.0 + 5.0 * draw.random()
    return scale * (1.0 + 0.05 * (2 * random.Random(
        1_000_003 * step + slot).random() - 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="extra compute time per step, ms")
    ap.add_argument("--uneven", type=float, default=0.0,
                    help="uneven steps, as an RL job's: each step's extra "
                    "compute is --step-ms times a lognormal draw of this "
                    "sigma (5%% of steps 5-10x), the same on every slot, "
                    "with 5%% noise of the slot's own")
    ap.add_argument("--spike-factor", type=float, default=0.0,
                    help="roll back a step whose loss is above this "
                    "multiple of its running median (0: off)")
    ap.add_argument("--skip-data", default="",
                    help="batches to skip, as a job that rolled back past a "
                    "numeric anomaly skipped them: B:E[,B:E...] (positions "
                    "[B, E); summary.json's skipped_data), for a reference "
                    "run")
    ap.add_argument("--dcp-dir", default="",
                    help="write the state as a torch.distributed.checkpoint "
                    "to DIR/step-<s> every --dcp-every steps")
    ap.add_argument("--dcp-every", type=int, default=0)
    ap.add_argument("--from-dcp", default="",
                    help="start a fresh job from this DCP checkpoint (its "
                    "model, momentum, data position and step)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model trains: cpu (Gloo) or cuda (NCCL)")
    ap.add_argument("--standby-warmup", choices=("on", "off"), default="on",
                    help="a standby runs a forward and backward pass before "
                    "it waits for a slot (run's standby_warmup)")
    args = ap.parse_args()
    if args.steps < 0 or args.batch < 1:
        ap.error("--steps must be >= 0 and --batch >= 1")

    torch.set_num_threads(1)
    device, options = example_run.device(args.device)
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # SGD creates its momentum at the first step; start it at zero so it can
    # be registered (the same arithmetic as a fresh buffer).
    for p in model.parameters():
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)

    try:
        rt = holdfast.Runtime(**options)
    except holdfast.HoldfastError as e:
        print(f"ddp_train: {e}", file=sys.stderr)
        return 1
    rt.register_module(model, "model")
    rt.register_optimizer(opt, "sgd")
    # The index of the next batch: a rollback restores it, and the runtime
    # moves it past the batches the job skips.
    data_pos = torch.zeros(1, dtype=torch.int64)
    rt.register_data_position("data_pos", data_pos)
    hd.init_process_group(rt)
    start_step = 0
    if args.from_dcp:
        try:
            start_step = holdfast.dcp.load(rt, args.from_dcp)
        except holdfast.HoldfastError as e:
            print(f"ddp_train: {e}", file=sys.stderr)
            return 1

    last_loss = [0.0]
    last_grad_norm = [0.0]

    def step(ctx):
        ddp = hd.ddp(rt, model)
        # Batch k (from 1) is the one step k gets when nothing is skipped.
        x, y = make_batch(int(data_pos[0]) + 1, args.batch)
        x, y = x.to(device), y.to(device)
        lo = args.batch * ctx.slot // ctx.world_size
        hi = args.batch * (ctx.slot + 1) // ctx.world_size
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(ddp(x[lo:hi]), y[lo:hi])
        loss.backward()
        if args.step_ms > 0:
            time.sleep(args.step_ms / 1000 *
                       step_scale(args.uneven, ctx.step, ctx.slot))
        last_grad_norm[0] = float(torch.norm(torch.stack(
            [p.grad.norm() for p in model.parameters()])))
        ctx.runtime.begin_state_update()  # the first write comes next
        opt.step()
        data_pos.add_(1)
        last_loss[0] = float(loss)

    def warmup():
        # A standby's forward and backward on batch 1's rows, outside DDP,
        # before it waits for a slot (run's standby_warmup): on a GPU its
        # first step would load cuBLAS and CUDA's kernels while the
        # survivors wait. It leaves no gradient and the RNGs as they were.
        rows = max(1, args.batch // max(1, rt.world_size))
        x, y = make_batch(1, args.batch)
        with torch.random.fork_rng(
                devices=[device] if device.type == "cuda" else []):
            loss = torch.nn.functional.mse_loss(
                model(x[:rows].to(device)), y[:rows].to(device))
            loss.backward()
        opt.zero_grad(set_to_none=True)

    skip = [tuple(int(v) for v in r.split(":"))
            for r in args.skip_data.split(",") if r]
    result, code = example_run.run("ddp_train", lambda: rt.run(
        step, args.steps,
        metrics=lambda: {"loss": last_loss[0], "grad_norm": last_grad_norm[0]},
        skip_data=skip, spike_factor=args.spike_factor, start_step=start_step,
        dcp_dir=args.dcp_dir or None, dcp_every=args.dcp_every,
        standby_warmup=warmup if args.standby_warmup == "on" else None))
    if result is None:
        return code

    example_run.report(result, last_loss[0],
                       state_sha256(model, opt, data_pos))
    return 0


if __name__ == "__main__":
    sys.exit(main())
