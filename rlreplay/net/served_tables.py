"""What a client knows of a server's tables: their descriptions, fetched once, and the
insert plans made from them.

A :class:`~rlreplay.net.client.Client` asks the server to ``describe`` its tables on the
first call that needs it (one round trip, within that call's deadline) and keeps the
answer: the signatures and limits against which it checks rows before sending them. Per
table it keeps one :class:`~rlreplay.net.insert_rows.InsertPlan` for pipelined inserts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.net.insert_rows import InsertPlan

if TYPE_CHECKING:
    from rlreplay.net.transport import Transport


class ServedTables:
    """The descriptions of the tables served at ``address`` and their insert plans.

    Args:
        address: the server's address (for error messages).
        transport: the client's transport (fetches the descriptions).

    Attributes:
        plans: insert plan per table name, made on first use (read directly by
            ``Client.insert``, one dictionary lookup per call).
    """

    def __init__(self, address: str, transport: Transport):
        self.address = address
        self.transport = transport
        self.descriptions: dict[str, dict] | None = None
        self.plans: dict[str, InsertPlan] = {}

    def describe(self, table: str, until: Any) -> dict[str, Any]:
        """The description of ``table`` (signature, layout, sizes), fetched (once) within
        the caller's ``until``.

        Raises:
            InvalidArgumentError: if the server serves no table of that name (listing
                those it serves).
            ServerUnavailableError: if the server did not answer in time.
        """
        if self.descriptions is None:
            self.descriptions = self.transport.call({"op": "describe"}, until=until)[0]["tables"]
        if table not in self.descriptions:
            raise InvalidArgumentError(
                f"table {describe(table)} is not served at {self.address}; tables: "
                f"{sorted(self.descriptions)}"
            )
        return self.descriptions[table]

    def plan(self, table: str, until: Any) -> InsertPlan:
        """The insert plan of ``table``, made (and kept) from its description.

        Raises:
            as :meth:`describe`.
        """
        desc = self.describe(table, until)
        plan = InsertPlan(table, desc, self.transport.channel().max_message_bytes)
        self.plans[table] = plan
        return plan
