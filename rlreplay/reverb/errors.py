"""Reverb's exception names, each a subclass of rlreplay's own error it corresponds to,
so ``except reverb.errors.DeadlineExceededError`` and ``except rlreplay.ReplayTimeoutError``
both catch a call that ran out of time."""

from __future__ import annotations

import numpy as np

from rlreplay.errors import (
    ClosedError as _Closed,
)
from rlreplay.errors import (
    InvalidArgumentError as _InvalidArgument,
)
from rlreplay.errors import (
    RateLimiterTimeoutError as _RateLimiterTimeout,
)
from rlreplay.errors import (
    ReplayError,
    ReplayTimeoutError,
    ServerUnavailableError,
)
from rlreplay.errors import (
    SignatureError as _Signature,
)

__all__ = [
    "ClosedError",
    "DeadlineExceededError",
    "InvalidArgumentError",
    "RateLimiterTimeoutError",
    "ReverbError",
    "SignatureError",
    "UnavailableError",
]


class ReverbError(ReplayError):
    """Base class of Reverb's errors (an :class:`rlreplay.ReplayError`)."""


class DeadlineExceededError(ReverbError, ReplayTimeoutError):
    """A call to the server did not complete within its timeout."""


class RateLimiterTimeoutError(DeadlineExceededError, _RateLimiterTimeout):
    """A rate limiter blocked an insert or a sample for its whole timeout."""


class UnavailableError(DeadlineExceededError, ServerUnavailableError):
    """The server did not answer within the call's timeout (no server at the address,
    or it stopped)."""


class ClosedError(ReverbError, _Closed, RuntimeError):
    """A writer's method called after its ``close()`` (a ``RuntimeError``, as Reverb's
    failed precondition is)."""


def is_int(value: object) -> bool:
    """Whether ``value`` is a Python or numpy integer (a bool is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_open(closed: bool, method: str) -> None:
    """Refuse ``method`` (Reverb's name of it) of a writer that was closed.

    Raises:
        ClosedError: if ``closed``.
    """
    if closed:
        raise ClosedError(f"Calling method {method} after Close has been called")


class InvalidArgumentError(ReverbError, _InvalidArgument):
    """An argument the call refuses (also a ``ValueError``)."""


class SignatureError(InvalidArgumentError, _Signature):
    """Data that does not match a table's signature (also a ``ValueError``)."""


def translate(error: BaseException) -> BaseException:
    """The Reverb-named error for an rlreplay error (the same message), or ``error``."""
    for theirs, ours in (
        (_RateLimiterTimeout, RateLimiterTimeoutError),
        (ServerUnavailableError, UnavailableError),
        (ReplayTimeoutError, DeadlineExceededError),
        (_Signature, SignatureError),
        (_InvalidArgument, InvalidArgumentError),
    ):
        if isinstance(error, theirs) and not isinstance(error, ReverbError):
            new = ours(str(error))
            new.__cause__ = error
            return new
    return error
