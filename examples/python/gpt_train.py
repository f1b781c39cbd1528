#!/usr/bin/env python3
"""A small GPT on holdfast: a decoder-only transformer trained with AdamW.

The corpus is real text that every Debian system ships: the licence texts
of base-files in /usr/share/common-licenses (about 250 KB of English, GPL
to Apache), read as bytes; nothing is downloaded. The model predicts the
next byte. Batch k is a fixed draw of windows of the corpus, from a seed
of k, split evenly over the slots; the next batch's index is the
registered data position. DistributedDataParallel averages the gradients
over the "holdfast" process group (CPU on Gloo, or --device cuda on
NCCL), or with --parallel fsdp2 FSDP2 shards the model (see Fsdp2). The
model, AdamW's state (its step counts and both moments) and the data
position are registered, so a run with a fault in replace mode ends with
exactly the bytes of the fault-free run.

    holdfast-run -n 3 --standby 1 --inject kill:slot=1:step=20 -- \\
        .venv/bin/python3 examples/python/gpt_train.py --steps 40

It prints the loss every --log-every steps (slot 0), and each rank prints
one line at the end, with the hash of the whole state (parameters,
optimizer state, data position):
    final step=<N> world=<W> params_sha256=<hex>
Exit codes as ddp_train.py's: 0 done (also a standby that was never
needed), 3 fenced, 4 the job stopped, 1 any other error.
"""

import argparse
import hashlib
import math
import pathlib
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import holdfast
import holdfast.distributed as hd
import example_run
from fsdp_state import ShardedTensor, adopt_partitions
from mlp_data import state_sha256, tensor_bytes

CORPUS = pathlib.Path("/usr/share/common-licenses")


def load_corpus(root=CORPUS):
    """The corpus as a uint8 tensor of bytes (the files in name order)."""
    files = sorted(p for p in root.iterdir() if p.is_file())
    if not files:
        raise FileNotFoundError(f"{root}: no text (Debian's base-files ships it)")
    data = b"\n".join(p.read_bytes() for p in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
            torch.nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    """Byte-level decoder-only transformer."""

    def __init__(self, seq, dim, layers, heads, vocab=256):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(seq, dim)
        self.blocks = torch.nn.ModuleList(
            Block(dim, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer(
            "mask", torch.triu(torch.full((seq, seq), float("-inf")), 1),
            persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def make_batch(corpus, k, batch, seq):
    """Batch k: `batch` windows of seq + 1 bytes, from a seed of k."""
    gen = torch.Generator().manual_seed(1_000_003 * k + 17)
    starts = torch.randint(len(corpus) - seq - 1, (batch,), generator=gen)
    w = torch.stack([corpus[s:s + seq + 1] for s in starts.tolist()])
    return w[:, :-1], w[:, 1:]


class Ddp:
    """--parallel ddp: the whole model and AdamW's state on every slot,
    registered as replicated state; DistributedDataParallel averages the
    gradients."""

    def __init__(self, rt, model, args, device):
        self.rt, self.model, self.device = rt, model.to(device), device
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                     weight_decay=0.01)
        # AdamW creates its state at the first step; start it as a fresh
        # one would be, so that it can be registered.
        for p in model.parameters():
            self.opt.state[p] = {"step": torch.tensor(0.0),
                                 "exp_avg": torch.zeros_like(p),
                                 "exp_avg_sq": torch.zeros_like(p)}
        rt.register_module(model, "model")
        rt.register_optimizer(self.opt, "adamw")

    def begin(self, ctx):
        """The module to train this step and its optimizer."""
        return hd.ddp(self.rt, self.model), self.opt

    def end(self, ctx, data_pos):
        pass

    def restored(self, step):
        pass

    def grad_norm(self):
        return float(torch.norm(torch.stack(
            [p.grad.norm() for p in self.model.parameters()])))

    def digest(self, data_pos):
        return state_sha256(self.model, self.opt, data_pos)

    def warmup(self, x, y):
        """A standby's forward and backward, outside DDP (run's
        standby_warmup): on a GPU its first step would load cuBLAS and
        CUDA's kernels while the survivors wait. It leaves no gradient and
        the RNGs as they were."""
        with torch.random.fork_rng(
                devices=[self.device] if self.device.type == "cuda" else []):
            logits = self.model(x.to(self.device))
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                y.to(self.device).reshape(-1)).backward()
        self.opt.zero_grad(set_to_none=True)


class Fsdp2:
    """--parallel fsdp2: fully_shard on each block and on the whole model,
    each slot holding one shard of every parameter and of both AdamW
    moments, registered as sharded state (fsdp_state.py); AdamW's step
    counts are replicated. On the CPU FSDP's and AdamW's shards are the
    registered partitions (one copy); on a GPU the partitions are their
    host copies (Runtime.mirror_shard: copied at each step's end while
    the next step computes, and back after a restore). FSDP is built once
    this process has a slot. The world size must stay the same: run it
    with standbys."""

    MOMENTS = ("exp_avg", "exp_avg_sq")

    def __init__(self, rt, model, args, device):
        self.rt, self.model, self.args, self.device = rt, model, args, device
        self.world = rt.world_size
        full = dict(model.named_parameters())
        self.names = list(full)
        self.params = {n: ShardedTensor(rt, f"model.{n}", p, self.world)
                       for n, p in full.items()}
        self.moments = {(n, k): ShardedTensor(rt, f"adamw.{n}.{k}", p,
                                              self.world)
                        for n, p in full.items() for k in self.MOMENTS}
        self.steps = {n: torch.tensor(0.0) for n in self.names}
        for n in self.names:
            rt.register_tensor(f"adamw.{n}.step", self.steps[n])
        if not rt.standby:
            for n, p in full.items():
                self.params[n].fill_from_full(p, rt.slot)
                for k in self.MOMENTS:
                    self.moments[n, k].fill_from_full(torch.zeros_like(p),
                                                      rt.slot)
        self.in_place = device.type == "cpu"
        self.opt, self.pairs = None, []

    def _build(self):
        if self.rt.world_size != self.world:
            raise RuntimeError(
                f"gpt_train: the world is {self.rt.world_size} slots, not "
                f"{self.world}; --parallel fsdp2 keeps FSDP's shards on a "
                "world of a fixed size: run it with standbys")
        self.model.to(self.device)
        mesh = init_device_mesh(self.device.type, (self.world,))
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        if self.in_place:
            adopt_partitions(self.model, self.names, self.params)
        self.opt = torch.optim.AdamW(self.model.parameters(),
                                     lr=self.args.lr, weight_decay=0.01)
        for n, p in zip(self.names, self.model.parameters()):
            state = {"step": self.steps[n]}
            for k in self.MOMENTS:
                if self.in_place:
                    local, _ = self.moments[n, k].local_view(
                        p.to_local().shape[0])
                    state[k] = DTensor.from_local(
                        local, p.device_mesh, p.placements, run_check=False,
                        shape=p.shape, stride=p.stride())
                else:
                    state[k] = torch.zeros_like(p)
                self.pairs.append((self.moments[n, k], state[k]))
            self.opt.state[p] = state
            self.pairs.append((self.params[n], p))
        if not self.in_place:
            # The partitions become the host copies of the device shards
            # (and fill them now).
            for state, tensor in self.pairs:
                self.rt.mirror_shard(state.name, tensor.to_local())
        self.locals = [t.to_local().data_ptr() for _, t in self.pairs]

    def begin(self, ctx):
        if self.opt is None:
            self._build()
        if ctx.world_size != self.world:
            raise RuntimeError(
                f"gpt_train: the world shrank from {self.world} to "
                f"{ctx.world_size} slots; --parallel fsdp2 needs a world of "
                "a fixed size: run it with standbys")
        for (state, tensor), ptr in zip(self.pairs, self.locals):
            if (not state.in_place(tensor.to_local()) if self.in_place
                    else tensor.to_local().data_ptr() != ptr):
                raise RuntimeError(
                    f"gpt_train: '{state.name}' is no longer FSDP's shard")
        return self.model, self.opt

    def end(self, ctx, data_pos):
        if ctx.step == self.args.steps:
            # The runtime's communicator ends with run(): the hash is
            # taken in the last step, of the full tensors (parameters,
            # moments), then the step counts and the data position. On a
            # GPU the partitions get this step's shards first (the
            # runtime's own copy comes after the step).
            if not self.in_place:
                with torch.no_grad():
                    for state, tensor in self.pairs:
                        state.save(tensor.to_local())
            self.final = hashlib.sha256()
            for state in ([self.params[n] for n in self.names] +
                          [self.moments[n, k] for n in self.names
                           for k in self.MOMENTS]):
                self.final.update(tensor_bytes(
                    state.gather_full(ctx.comm, self.device)))
            for n in self.names:
                self.final.update(tensor_bytes(self.steps[n]))
            self.final.update(tensor_bytes(data_pos))

    def restored(self, step):
        if self.opt is None:
            self._build()  # a restore writes the mirrored shards itself

    def grad_norm(self):
        return float(torch.norm(torch.stack(
            [p.grad.to_local().norm() for p in self.model.parameters()])))

    def digest(self, data_pos):
        return self.final.hexdigest()

    warmup = None  # FSDP's forward communicates


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=12,
                    help="sequences per step, over all slots")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--device", choices=("cpu", "cuda"), default=(
        "cuda" if torch.cuda.is_available() else "cpu"),
        help="cpu (Gloo) or cuda (NCCL); default: cuda where there is a GPU")
    ap.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp",
                    help="ddp (every slot holds the whole model) or fsdp2 "
                    "(fully_shard: one shard each; run it with standbys)")
    ap.add_argument("--standby-warmup", choices=("on", "off"), default="on",
                    help="with ddp, a standby runs a forward and backward "
                    "pass before it waits for a slot (run's standby_warmup)")
    args = ap.parse_args()
    if (args.steps < 0 or args.batch < 1 or args.seq < 2 or args.layers < 1
            or args.dim % args.heads):
        ap.error("--steps >= 0, --batch >= 1, --seq >= 2, --layers >= 1, and "
                 "--dim a multiple of --heads")

    torch.set_num_threads(1)
    device, options = example_run.device(args.device)
    try:
        corpus = load_corpus()
    except OSError as e:
        print(f"gpt_train: {e}", file=sys.stderr)
        return 1
    torch.manual_seed(12345)
    model = GPT(args.seq, args.dim, args.layers, args.heads)
    try:
        rt = holdfast.Runtime(**options)
    except holdfast.HoldfastError as e:
        print(f"gpt_train: {e}", file=sys.stderr)
        return 1
    par = (Ddp if args.parallel == "ddp" else Fsdp2)(rt, model, args, device)
    data_pos = torch.zeros(1, dtype=torch.int64)
    rt.register_data_position("data_pos", data_pos)
    hd.init_process_group(rt)
    last = {"loss": 0.0, "grad_norm": 0.0}

    def step(ctx):
        net, opt = par.begin(ctx)
        x, y = make_batch(corpus, int(data_pos[0]) + 1, args.batch, args.seq)
        lo = args.batch * ctx.slot // ctx.world_size
        hi = args.batch * (ctx.slot + 1) // ctx.world_size
        x, y = x[lo:hi].to(device), y[lo:hi].to(device)
        opt.zero_grad(set_to_none=False)
        logits = net(x)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        last["grad_norm"] = par.grad_norm()
        ctx.runtime.begin_state_update()  # the first write comes next
        opt.step()
        data_pos.add_(1)
        par.end(ctx, data_pos)
        last["loss"] = float(loss.detach())
        if ctx.slot == 0 and (ctx.step % args.log_every == 0 or ctx.step == 1):
            print(f"step {ctx.step} loss {last['loss']:.4f} "
                  f"({last['loss'] / math.log(2):.3f} bits/byte)", flush=True)

    def warmup():
        rows = max(1, args.batch // max(1, rt.world_size))
        x, y = make_batch(corpus, 1, args.batch, args.seq)
        par.warmup(x[:rows], y[:rows])

    use_warmup = args.standby_warmup == "on" and par.warmup is not None
    result, code = example_run.run("gpt_train", lambda: rt.run(
        step, args.steps, metrics=lambda: dict(last), on_restore=par.restored,
        standby_warmup=warmup if use_warmup else None))
    if result is None:
        return code
    if isinstance(par, Fsdp2) and par.in_place:
        # Every step checked that FSDP's and AdamW's shards are the
        # registered partitions.
        print(f"shards_in_place={len(par.pairs)}", file=sys.stderr)
    example_run.report(result, last["loss"], par.digest(data_pos))
    return 0


if __name__ == "__main__":
    sys.exit(main())
