"""holdfast's exceptions, one per status code of the C++ library.

Every holdfast call that fails raises a subclass of HoldfastError whose
``code`` is the absl status code. PeerLostError, TimeoutError and
AbortedError are *recoverable*: raised inside a step function, they make
Runtime.run() recover and go on.
"""

import builtins


class HoldfastError(RuntimeError):
    """A holdfast call failed; ``code`` is the absl status code."""

    code = 2  # UNKNOWN


class CancelledError(HoldfastError):
    """The call was cancelled (for example: a standby that was never needed)."""

    code = 1


class InvalidArgumentError(HoldfastError, ValueError):
    """Bad input: a wrong argument, option, tensor or request."""

    code = 3


class TimeoutError(HoldfastError, builtins.TimeoutError):  # noqa: A001
    """An operation passed its deadline (a hung or frozen peer)."""

    code = 4


class NotFoundError(HoldfastError, LookupError):
    code = 5


class AlreadyExistsError(HoldfastError):
    code = 6


class ResourceExhaustedError(HoldfastError):
    code = 8


class FencedError(HoldfastError):
    """FailedPrecondition: this member was declared dead and fenced, or the
    call is not valid in the current state."""

    code = 9


class AbortedError(HoldfastError):
    """The communicator was aborted, or the job stopped."""

    code = 10


class OutOfRangeError(HoldfastError):
    code = 11


class UnimplementedError(HoldfastError):
    code = 12


class InternalError(HoldfastError):
    code = 13


class PeerLostError(HoldfastError):
    """Unavailable: a peer's connection or the controller was lost."""

    code = 14


class DataLossError(HoldfastError):
    """No good copy of a checkpoint piece is left, or a shard is corrupt."""

    code = 15


class UnauthenticatedError(HoldfastError):
    """The job token was wrong or missing."""

    code = 16


_BY_CODE = {
    cls.code: cls
    for cls in (
        CancelledError,
        InvalidArgumentError,
        TimeoutError,
        NotFoundError,
        AlreadyExistsError,
        ResourceExhaustedError,
        FencedError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        PeerLostError,
        DataLossError,
        UnauthenticatedError,
    )
}

RECOVERABLE = (PeerLostError, TimeoutError, AbortedError)


def error_for_code(code):
    """The exception class for an absl status code (HoldfastError if none)."""
    return _BY_CODE.get(int(code), HoldfastError)
