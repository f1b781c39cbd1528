"""The examples' data: batch k of a fixed target function, from a seed of k
(the same on every process, so that a run is deterministic)."""

import torch


def make_batch(step, batch):
    gen = torch.Generator().manual_seed(1_000_003 * step + 17)
    x = torch.rand(batch, 16, generator=gen) * 2 - 1
    w = torch.linspace(0.5, -0.25, 16)
    y = torch.sin(2 * (x @ w)).unsqueeze(1) + 0.1 * x[:, :1] * x[:, 1:2]
    return x, y
