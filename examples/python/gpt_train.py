#!/usr/bin/env python3
"""A small GPT on holdfast: a decoder-only transformer trained with AdamW.

The corpus is real text that every Debian system ships: the licence texts
of base-files in /usr/share/common-licenses (about 250 KB of English, GPL
to Apache), read as bytes; nothing is downloaded. The model predicts the
next byte. Batch k is a fixed draw of windows of the corpus, from a seed
of k, split evenly over the slots; the next batch's index is the
registered data position. DistributedDataParallel averages the gradients
over the "holdfast" process group (CPU on Gloo, or --device cuda on
NCCL). The model, AdamW's state (its step counts and both moments) and
the data position are registered, so a run with a fault in replace mode
ends with exactly the bytes of the fault-free run.

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
import math
import pathlib
import sys

import torch

import holdfast
import holdfast.distributed as hd
import example_run
from mlp_data import state_sha256

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
    ap.add_argument("--standby-warmup", choices=("on", "off"), default="on",
                    help="a standby runs a forward and backward pass before "
                    "it waits for a slot (run's standby_warmup)")
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
    model = GPT(args.seq, args.dim, args.layers, args.heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            weight_decay=0.01)
    # AdamW creates its state at the first step; start it as a fresh one
    # would be, so that it can be registered.
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p)}

    try:
        rt = holdfast.Runtime(**options)
    except holdfast.HoldfastError as e:
        print(f"gpt_train: {e}", file=sys.stderr)
        return 1
    rt.register_module(model, "model")
    rt.register_optimizer(opt, "adamw")
    data_pos = torch.zeros(1, dtype=torch.int64)
    rt.register_data_position("data_pos", data_pos)
    hd.init_process_group(rt)
    last = {"loss": 0.0, "grad_norm": 0.0}

    def step(ctx):
        ddp = hd.ddp(rt, model)
        x, y = make_batch(corpus, int(data_pos[0]) + 1, args.batch, args.seq)
        lo = args.batch * ctx.slot // ctx.world_size
        hi = args.batch * (ctx.slot + 1) // ctx.world_size
        x, y = x[lo:hi].to(device), y[lo:hi].to(device)
        opt.zero_grad(set_to_none=False)
        logits = ddp(x)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        last["grad_norm"] = float(torch.norm(torch.stack(
            [p.grad.norm() for p in model.parameters()])))
        ctx.runtime.begin_state_update()  # the first write comes next
        opt.step()
        data_pos.add_(1)
        last["loss"] = float(loss.detach())
        if ctx.slot == 0 and (ctx.step % args.log_every == 0 or ctx.step == 1):
            print(f"step {ctx.step} loss {last['loss']:.4f} "
                  f"({last['loss'] / math.log(2):.3f} bits/byte)", flush=True)

    def warmup():
        # A standby's forward and backward on batch 1's rows, outside DDP,
        # before it waits for a slot (run's standby_warmup): on a GPU its
        # first step would load cuBLAS and CUDA's kernels while the
        # survivors wait. It leaves no gradient and the RNGs as they were.
        rows = max(1, args.batch // max(1, rt.world_size))
        x, y = make_batch(corpus, 1, args.batch, args.seq)
        with torch.random.fork_rng(
                devices=[device] if device.type == "cuda" else []):
            logits = model(x[:rows].to(device))
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                y[:rows].to(device).reshape(-1)).backward()
        opt.zero_grad(set_to_none=True)

    result, code = example_run.run("gpt_train", lambda: rt.run(
        step, args.steps, metrics=lambda: dict(last),
        standby_warmup=warmup if args.standby_warmup == "on" else None))
    if result is None:
        return code
    example_run.report(result, last["loss"], state_sha256(model, opt, data_pos))
    return 0


if __name__ == "__main__":
    sys.exit(main())
