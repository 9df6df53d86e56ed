"""Serving one request: from the frames a client sent to its reply, or to a parked call.

:meth:`RequestHandler.handle` checks a request completely (schema, size, envelope, client
limits) before any table changes, then runs its handler, parks it or answers it. Errors are
always answered as typed errors, never raised into the dispatcher.
"""

from __future__ import annotations

import logging
import time

from rlreplay.errors import InvalidArgumentError, ReplayError
from rlreplay.net.server.limits import ClientLedger, check_envelope, check_lease
from rlreplay.net.server.operations import OPERATIONS, ServerOperations
from rlreplay.net.server.parking import ParkedCalls, cap_deadline, refuse_lapsed
from rlreplay.net.server.replies import Replies
from rlreplay.net.server.shm import SharedSegments
from rlreplay.net.wire import codec
from rlreplay.net.wire.schema import operation_of

log = logging.getLogger("rlreplay.net")


class RequestHandler:
    """Checks, runs and answers (or parks) one request at a time, on the dispatcher thread.

    Args:
        operations, clients, replies, parked, shm: the server's parts of those names.
        max_message_bytes: the largest request taken, all its frames together.

    Attributes:
        epoch: the server's epoch (set at each start); other epochs are refused.
    """

    def __init__(
        self,
        operations: ServerOperations,
        clients: ClientLedger,
        replies: Replies,
        parked: ParkedCalls,
        shm: SharedSegments,
        max_message_bytes: int,
    ):
        self.operations = operations
        self.clients = clients
        self.replies = replies
        self.parked = parked
        self.shm = shm
        self.max_message_bytes = max_message_bytes
        self.epoch: int | None = None

    def handle(self, frames: list) -> bool:
        """Serve one request; True if it may have changed a table."""
        identity, body = frames[0], frames[1:]
        rid = None
        try:
            header = codec.decode_header(body)
            rid = header.get("id")
            if len(body) > 1 and sum(map(len, body)) > self.max_message_bytes:
                # ZeroMQ bounds each frame; this bounds the frames of a request together
                raise self._too_large(sum(map(len, body)))
            arrays = codec.decode_arrays(header, body)
            client = identity.bytes
            now = time.monotonic()
            if "shm_in" in header:  # arrays a same-host client placed in its shared memory
                self.shm.request_arrays(client, header, arrays, self.epoch, now)
            op = operation_of(header, OPERATIONS)
            op.check(header, arrays)  # every field, before any handler
            self.clients.heard(client, now)
            expires = check_envelope(header, op.name, self.epoch, now)
            lease = check_lease(header)
            if lease is not None:
                self.clients.renew(client, lease)
            self.clients.admit(client, op)
            self.operations.caller = client
            result = op.handler(self.operations, header, arrays)
            if op.parks:
                result.identity, result.rid = identity, rid
                cap_deadline(result, expires)
                refuse_lapsed(result, lease, now)
                reply = result.attempt()
                if reply is None:
                    self.parked.park(result, client, time.monotonic(), lease)
                else:
                    self.replies.ok(identity, rid, *reply)
            elif not header.get("noreply"):
                self.replies.ok(identity, rid, *result)
            return op.mutates
        except ReplayError as exc:
            self.replies.error(identity, rid, exc)
        except Exception as exc:
            log.exception("internal error serving a request")
            exc = ReplayError(f"internal server error: {exc!r}")
            self.replies.error(identity, rid, exc)
        return True

    def _too_large(self, nbytes: int) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"the request is {nbytes} bytes, more than this server's "
            f"max_message_bytes={self.max_message_bytes}; send less per request"
        )
