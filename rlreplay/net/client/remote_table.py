"""A served table behind the method signatures of a local :class:`~rlreplay.Table`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.core.table import TableInfo

if TYPE_CHECKING:
    from rlreplay.net.client.client import Client


class RemoteTable:
    """A served table with the same calls as a local :class:`~rlreplay.Table`, so code
    written against a table runs against a server unchanged (see :meth:`Client.table`).

    Example:
        >>> replay = Client(address).table("replay")              # doctest: +SKIP
        >>> batch = replay.sample(256, timeout=5.0)               # doctest: +SKIP
    """

    def __init__(self, client: Client, name: str):
        self.client, self.name = client, name

    @property
    def layout(self):
        """The table's :class:`~rlreplay.ItemLayout` (``layout.span`` and its windows)."""
        from types import SimpleNamespace

        from rlreplay.core.layout import ItemLayout

        desc = self.client.describe(self.name)
        try:
            return ItemLayout.from_json(desc["layout"], self.client.signature(self.name))
        except Exception:  # a layout kind this client does not know: its span still holds
            return SimpleNamespace(span=desc["span"])

    def insert(self, rows, priorities=None, *, timeout=None) -> np.ndarray:
        return self.client.insert(self.name, rows, priorities, timeout=timeout)

    def sample(self, batch_size: int, *, timeout: float | None = None) -> Sample:
        return self.client.sample(self.name, batch_size, timeout=timeout)

    def update_priorities(self, keys, priorities) -> int:
        return self.client.update_priorities(self.name, keys, priorities)

    def delete(self, keys) -> int:
        return self.client.delete(self.name, keys)

    def reset(self) -> None:
        self.client.reset(self.name)

    def info(self) -> TableInfo:
        return self.client.info(self.name)

    def can_insert(self, num_inserts: int = 1) -> bool:
        return self.client.can_insert(self.name, num_inserts)

    def can_sample(self, num_samples: int = 1) -> bool:
        return self.client.can_sample(self.name, num_samples)

    def __len__(self) -> int:
        return self.info().size

    def __repr__(self) -> str:
        return f"RemoteTable({self.name!r} at {self.client.address!r})"
