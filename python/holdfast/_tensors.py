"""Torch tensors as (address, element count, dtype code) for holdfast._C."""

import torch

from . import _C
from .errors import InvalidArgumentError

_DTYPES = {
    torch.float32: _C.DTYPE_CODES["float32"],
    torch.float64: _C.DTYPE_CODES["float64"],
    torch.int32: _C.DTYPE_CODES["int32"],
    torch.int64: _C.DTYPE_CODES["int64"],
    torch.bfloat16: _C.DTYPE_CODES["bfloat16"],
    torch.float16: _C.DTYPE_CODES["float16"],
    torch.uint8: _C.DTYPE_CODES["uint8"],
    torch.int8: _C.DTYPE_CODES["int8"],
    torch.bool: _C.DTYPE_CODES["bool"],
}


def buffer(tensor, what="tensor", device_memory=False):
    """Checks that `tensor` is a contiguous tensor of a supported dtype in
    the memory a communicator takes: a CUDA tensor when `device_memory`
    (the NCCL backend), else a CPU tensor (Gloo).

    Returns (address, element count, dtype code). Raises
    InvalidArgumentError naming `what` otherwise.
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"{what}: expected a torch.Tensor, got {type(tensor).__name__}"
        )
    if device_memory and tensor.device.type != "cuda":
        raise InvalidArgumentError(
            f"{what}: a {tensor.device.type} tensor, but this communicator "
            "runs on NCCL and takes CUDA tensors (move it with .cuda(), or "
            "run the job with HOLDFAST_BACKEND=gloo for CPU tensors)"
        )
    if not device_memory and tensor.device.type != "cpu":
        raise InvalidArgumentError(
            f"{what}: a {tensor.device.type} tensor, but this communicator "
            "runs on Gloo and takes CPU tensors (run the job with "
            "HOLDFAST_BACKEND=nccl for CUDA tensors, or copy it with .cpu())"
        )
    check_contiguous(tensor, what)
    check_dtype(tensor, what)
    return tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype]


def check_contiguous(tensor, what="tensor"):
    """InvalidArgumentError naming `what` unless `tensor` is contiguous."""
    if not tensor.is_contiguous():
        raise InvalidArgumentError(
            f"{what}: not contiguous (shape {tuple(tensor.shape)}, stride "
            f"{tensor.stride()}); call .contiguous() first"
        )


def check_dtype(tensor, what="tensor"):
    """InvalidArgumentError naming `what` unless the communicators take
    `tensor`'s dtype."""
    if tensor.dtype not in _DTYPES:
        raise InvalidArgumentError(
            f"{what}: dtype {tensor.dtype} is not supported (float32, float64, "
            "int32, int64, bfloat16, float16, uint8, int8, bool)"
        )


def host_buffer(tensor, what="tensor"):
    """buffer() of a CPU tensor."""
    return buffer(tensor, what, device_memory=False)
