"""The examples' MLP and its data: batch k of a fixed target function,
from a seed of k (the same on every process, so that a run is
deterministic)."""

import ctypes
import hashlib

import torch


def make_model():
    """The MLP (16 -> 32 tanh -> 1), from a fixed seed."""
    torch.manual_seed(12345)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def tensor_bytes(tensor):
    """A tensor's bytes in row-major order, as the examples hash them
    (without numpy, which `pip install holdfast` does not bring)."""
    t = tensor.detach().cpu().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def state_sha256(model, opt, data_pos):
    """The hash of a trainer's whole state, as the examples print it: the
    model's state_dict, its optimizer's state (by parameter index, then
    key) and the data position."""
    digest = hashlib.sha256()
    tensors = list(model.state_dict().values())
    state = opt.state_dict()["state"]
    for index in sorted(state):
        tensors += [state[index][key] for key in sorted(state[index])
                    if isinstance(state[index][key], torch.Tensor)]
    for t in tensors + [data_pos]:
        digest.update(tensor_bytes(t))
    return digest.hexdigest()


def make_batch(step, batch):
    gen = torch.Generator().manual_seed(1_000_003 * step + 17)
    x = torch.rand(batch, 16, generator=gen) * 2 - 1
    w = torch.linspace(0.5, -0.25, 16)
    y = torch.sin(2 * (x @ w)).unsqueeze(1) + 0.1 * x[:, :1] * x[:, 1:2]
    return x, y
