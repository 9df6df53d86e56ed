"""Typed errors raised by rlreplay.

Bad input raises :class:`InvalidArgumentError` (a ``ValueError``); expired waits raise
:class:`TimeoutError` subclasses. Decide by the error's type, never its message text.
"""

from __future__ import annotations

import numbers


class ReplayError(Exception):
    """Base class of every error rlreplay raises on purpose."""


class InvalidArgumentError(ReplayError, ValueError):
    """An argument has a wrong name, type, shape, dtype or value; nothing stored was changed.

    The message names the argument, the value given and what to do instead.
    """


class SignatureError(InvalidArgumentError):
    """Step or row data does not match the table's signature (names, shapes, dtypes)."""


class DeadlockError(InvalidArgumentError):
    """A configuration or request that could never make progress (it would wait forever)."""


class DatasetError(InvalidArgumentError):
    """A dataset cannot be exported or imported as asked (missing episode boundaries, an
    unreadable file, a table it does not fit); nothing was written or inserted."""


class ReplayTimeoutError(ReplayError, TimeoutError):
    """A blocking call waited for its whole ``timeout`` without being allowed to proceed."""


class RateLimiterTimeoutError(ReplayTimeoutError):
    """The rate limiter kept an insert or a sample blocked until ``timeout`` expired."""


class InsufficientMemoryError(InvalidArgumentError):
    """A store or table needs more memory than available (raised before anything is allocated).

    Attributes:
        needed_bytes: bytes the configuration allocates.
        available_bytes: bytes available to it (see :mod:`rlreplay.core.memory`).
    """

    def __init__(self, message: str, needed_bytes: int = 0, available_bytes: int = 0):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes


class EmptyTableError(ReplayError):
    """A call needs items but the table holds none that it may use."""


class ClosedError(ReplayError):
    """The object was closed (a writer, a table after ``close()``, a client or server)."""


def describe(value: object, limit: int = 60) -> str:
    """Short one-line form of ``value`` for error messages (at most ``limit`` characters); an
    array (or list of them) too long to print is named by type, shape and dtype."""
    try:
        text = " ".join(repr(value).split())
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply to print>"
    if len(text) <= limit:
        return text
    summary = _summary(value)
    if summary is None and isinstance(value, (tuple, list)) and value:
        first = _summary(value[0])
        if first is not None:
            summary = f"{type(value).__name__} of {len(value)} values, first {first}"
    if summary is not None and len(summary) <= limit:
        return summary
    return text[: limit - 3] + "..."


def _summary(value: object) -> str | None:
    """``"<type> of shape (2, 4), float32"`` for an array-like, else ``None``."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if not isinstance(shape, tuple) or dtype is None:
        return None
    return f"{type(value).__name__} of shape {shape}, {dtype}"


class CheckpointError(ReplayError):
    """A checkpoint could not be written or restored; a failed restore never changes a table."""


class CheckpointNotFoundError(CheckpointError):
    """No complete, valid checkpoint is where restore looked."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint is incomplete or damaged (missing file, bad size, checksum or manifest)."""


class CheckpointVersionError(CheckpointError):
    """A checkpoint was written in a format version this rlreplay does not read."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint's table definitions differ from the ones given to restore; pass
    ``adapt=True`` where the message says a difference can be adapted."""


class ProtocolError(ReplayError):
    """A network message was malformed or spoke another protocol version."""


class AddressInUseError(InvalidArgumentError):
    """A server cannot bind its address (another socket holds it); choose another port, or none.

    Attributes:
        address: the address that could not be bound (``tcp://host:port``).
    """

    def __init__(self, message: str, address: str | None = None):
        super().__init__(message)
        self.address = address


class ServerUnavailableError(ReplayTimeoutError, ConnectionError):
    """The replay server did not answer within the timeout (down, unreachable, or it rejected
    the client's credentials).

    Attributes:
        reason: why, when the client could tell: ``"refused"``, ``"unresolved"``,
            ``"needs_curve"``, ``"not_curve"``, ``"wrong_server_key"``,
            ``"client_not_authorized"``, ``"ok"`` (connects, no answer), ``"silent"``; or None.
    """

    def __init__(self, message: str = "", reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class ShardUnavailableError(ServerUnavailableError):
    """One replay server (shard) of a :class:`~rlreplay.ShardedClient` did not answer (under
    ``on_shard_down="fail"``, or ``"skip"`` with no shard reachable); it changed nothing there.

    Attributes:
        shard: the shard's index in the client's address list.
        address: the shard's address.
    """

    def __init__(
        self, message: str = "", reason: str | None = None, shard: int = -1, address: str = ""
    ):
        super().__init__(message, reason)
        self.shard = shard
        self.address = address


class ServerRestartedError(ServerUnavailableError):
    """The server restarted during a call, which was not applied and never will be; retry it."""


class ResourceLimitError(ReplayError):
    """The server refused a request because this client is over a per-client limit; nothing
    was applied. Read outstanding replies before sending more, or raise the limit."""


class ComponentFailedError(ReplayError):
    """A part of a training run (an actor, the learner, the server) raised or died.

    ``component`` names it; the original exception, if any, is the ``__cause__``. Every other
    part of the run was stopped before this was raised."""

    def __init__(self, component: str, message: str):
        super().__init__(f"{component} failed: {message}")
        self.component = component


def check_count(value: object, name: str, hint: str = "", minimum: int = 1) -> int:
    """``value`` (the argument ``name``) as an int >= ``minimum``; ``hint`` says what it counts.

    Raises:
        InvalidArgumentError: for a bool, a non-integer or a value below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        said = f" ({hint})" if hint else ""
        raise InvalidArgumentError(f"{name}={describe(value)} must be an int >= {minimum}{said}")
    return int(value)


WAIT_WITHOUT_LIMIT = (
    "wait without limit; use can_insert()/can_sample() to check without waiting"
)


def check_timeout(
    value: object, name: str = "timeout", none: str = WAIT_WITHOUT_LIMIT
) -> float | None:
    """``value`` (the argument ``name``) as seconds > 0, or None; ``none`` says what None does.

    Raises:
        InvalidArgumentError: for a bool, a non-number or a value <= 0.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(
            f"{name}={describe(value)} must be a number of seconds > 0, or None to {none}"
        )
    return float(value)


def check_keywords(make: object, given: dict, what: str) -> None:
    """Refuse keyword arguments ``make`` does not take, naming ``what`` and the keywords taken.

    Raises:
        InvalidArgumentError: for keywords ``make`` has no parameter of.
    """
    import inspect

    taken = [name for name in inspect.signature(make).parameters if name != "self"]
    unknown = sorted(set(given) - set(taken))
    if unknown:
        raise InvalidArgumentError(f"{what} has unknown keys {unknown}; it takes {taken}")
