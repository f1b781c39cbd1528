"""One NCCL per process: holdfast's NCCL backend must run the libnccl.so.2
that torch runs. Two copies of NCCL in one process is undefined behaviour,
and a holdfast built against another NCCL than torch's may call what the
loaded one lacks."""

import os

import torch

from . import _C
from .errors import FencedError


def _text(code):
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def loaded_libraries(maps="/proc/self/maps"):
    """The distinct libnccl files mapped into this process."""
    found = set()
    try:
        with open(maps) as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libnccl.so"):
                    found.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(found)


def check(versions=None, torch_version=None, libraries=None):
    """Raises FencedError (FailedPrecondition) naming both versions when
    torch's NCCL and the one holdfast was built against differ, or naming
    the files when more than one libnccl is loaded. Does nothing in a
    build without the NCCL backend or with a torch without NCCL. The
    arguments are for tests; by default they are read from this process."""
    versions = _C.nccl_versions() if versions is None else versions
    if versions is None:
        return
    loaded, built = versions
    if torch_version is None:
        try:
            torch_version = tuple(torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            return
    torch_code = torch_version[0] * 10000 + torch_version[1] * 100 + \
        torch_version[2]
    libraries = loaded_libraries() if libraries is None else libraries
    if len(libraries) > 1:
        raise FencedError(
            "holdfast: two NCCL libraries are loaded in this process "
            f"({', '.join(libraries)}); holdfast must use torch's. Import "
            "torch before holdfast, and do not put another libnccl.so.2 on "
            "LD_LIBRARY_PATH or LD_PRELOAD")
    if torch_code != built or loaded != built:
        raise FencedError(
            f"holdfast: NCCL version mismatch: torch {torch.__version__} runs "
            f"NCCL {_text(torch_code)}, holdfast was built against NCCL "
            f"{_text(built)} (and this process loaded {_text(loaded)}); "
            "rebuild holdfast against torch's NCCL (the nvidia-nccl wheel "
            "its pin depends on; scripts/setup.sh does)")
