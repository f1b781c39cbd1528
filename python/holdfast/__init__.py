"""holdfast: fault-tolerant training that survives lost ranks in-process.

    import holdfast
    rt = holdfast.Runtime()               # joins the job (HOLDFAST_* env)
    rt.register_module(model)
    rt.register_optimizer(optimizer)
    rt.run(step_fn, steps=1000)           # recovers from failures itself

See docs/python.md.
"""

from . import errors
from .errors import (  # noqa: F401
    AbortedError,
    CancelledError,
    DataLossError,
    FencedError,
    HoldfastError,
    InvalidArgumentError,
    NotFoundError,
    PeerLostError,
    TimeoutError,
    UnauthenticatedError,
)
from .runtime import Communicator, Runtime, StepContext, current_runtime  # noqa: F401

__all__ = [
    "errors",
    "AbortedError",
    "CancelledError",
    "DataLossError",
    "FencedError",
    "HoldfastError",
    "InvalidArgumentError",
    "NotFoundError",
    "PeerLostError",
    "TimeoutError",
    "UnauthenticatedError",
    "Communicator",
    "Runtime",
    "StepContext",
    "current_runtime",
]
