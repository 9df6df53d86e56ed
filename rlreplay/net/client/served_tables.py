"""What a client knows of a server's tables: descriptions and signatures, fetched once on
the first call that needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError, describe

if TYPE_CHECKING:
    from rlreplay.net.client.transport import Transport


class ServedTables:
    """The descriptions of the tables served at ``address`` and their signatures.

    Args:
        address: the server's address (for error messages).
        transport: the client's transport (fetches the descriptions).
    """

    def __init__(self, address: str, transport: Transport):
        self.address = address
        self.transport = transport
        self.descriptions: dict[str, dict] | None = None
        self.signatures: dict[str, Signature] = {}

    def describe(self, table: str, until: Any) -> dict[str, Any]:
        """The description of ``table`` (signature, layout, sizes), fetched once within
        ``until``.

        Raises:
            InvalidArgumentError: if the server serves no table of that name.
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

    def signature(self, table: str, until: Any) -> Signature:
        """The signature of ``table`` (from its description, made once).

        Raises:
            as :meth:`describe`.
        """
        sig = self.signatures.get(table)
        if sig is None:
            sig = self.signatures[table] = Signature.from_json(
                self.describe(table, until)["signature"]
            )
        return sig
