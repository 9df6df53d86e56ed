"""What a client is made from: address, CURVE keys, timeouts and shared-memory choice,
checked once. A client pickles as these settings, so they are kept apart from its sockets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.net.wire import auth


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """A client's checked settings: the :class:`~rlreplay.Client`'s arguments, with the
    address normalized and the keys read. Build them with :meth:`check`.
    """

    address: str
    server_public_key: bytes | None
    client_secret_key: tuple[bytes, bytes] | None
    call_timeout: float
    liveness_s: float
    diagnose_timeout: float
    shared_memory: bool | None

    @classmethod
    def check(
        cls,
        address: str,
        server_public_key: str | bytes | None,
        client_secret_key: str | bytes | tuple[bytes, bytes] | None,
        call_timeout: Any,
        liveness_s: Any,
        diagnose_timeout: Any,
        shared_memory: bool | None,
    ) -> ClientSettings:
        """The settings of a client with these arguments (``shared_memory`` is checked
        where it is used).

        Raises:
            InvalidArgumentError: for a malformed address, unreadable key files, or a
                timeout out of range (naming the argument and its value).
        """
        address = auth.normalize_address(address)
        server_key = auth.public_key(server_public_key)
        client_keys = auth.client_keys(client_secret_key) if server_key else None
        if (
            isinstance(liveness_s, bool)
            or not isinstance(liveness_s, (int, float))
            or not (liveness_s > 0)
        ):
            raise InvalidArgumentError(f"liveness_s={describe(liveness_s)} must be seconds > 0")
        if (
            isinstance(diagnose_timeout, bool)
            or not isinstance(diagnose_timeout, (int, float))
            or not 0 <= diagnose_timeout <= 60
        ):
            raise InvalidArgumentError(
                f"diagnose_timeout={describe(diagnose_timeout)} must be seconds in [0, 60]"
            )
        return cls(
            address,
            server_key,
            client_keys,
            check_call_timeout(call_timeout),
            float(liveness_s),
            float(diagnose_timeout),
            shared_memory,
        )

    def arguments(self, call_timeout: float) -> dict[str, Any]:
        """The :class:`~rlreplay.Client` keyword arguments these settings pickle as."""
        return {**dataclasses.asdict(self), "call_timeout": call_timeout}


def check_call_timeout(value: Any) -> float:
    """A client's ``call_timeout``: seconds > 0.

    Raises:
        InvalidArgumentError: naming ``call_timeout`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(
            f"call_timeout={describe(value)} must be seconds > 0: how long calls that never "
            "block on a rate limiter (info, update_priorities, ...) wait for their reply"
        )
    return float(value)
