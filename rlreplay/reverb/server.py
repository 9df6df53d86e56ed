"""Reverb's ``Table`` and ``Server`` over rlreplay's :class:`rlreplay.Table` and
:class:`rlreplay.Server`.

A Reverb table is an rlreplay table of *rows*, one row per item (see
:mod:`rlreplay.reverb._items` for how an item's columns are kept). The server also
serves one hidden table, ``__reverb_tables__``, holding the JSON description of every
table (signature nest, selectors, limiter) that clients read once.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

import rlreplay as _rr
from rlreplay.errors import describe
from rlreplay.reverb import item_selectors, rate_limiters, specs
from rlreplay.reverb._items import DEFAULT_MAX_ITEM_BYTES, ItemFormat
from rlreplay.reverb.errors import InvalidArgumentError, is_int
from rlreplay.reverb.reverb_types import META_TABLE, TableInfo, table_info

__all__ = ["Server", "Table", "TableExtensionBase"]


class TableExtensionBase:
    """Reverb's base of table extensions. rlreplay runs no table extensions: a table
    given any refuses them (:class:`~rlreplay.errors.InvalidArgumentError`)."""


class Table:
    """A Reverb table: items sampled by ``sampler``, evicted by ``remover`` beyond
    ``max_size``, paced by ``rate_limiter``.

    Args:
        name: the table's name (non-empty).
        sampler: an :mod:`~rlreplay.reverb.item_selectors` selector.
        remover: an :mod:`~rlreplay.reverb.item_selectors` selector.
        max_size: most items held (>= 1).
        rate_limiter: a :mod:`~rlreplay.reverb.rate_limiters` limiter.
        max_times_sampled: remove an item after this many samples (0: never).
        extensions: must be empty (rlreplay has no table extensions).
        signature: nest of specs (objects with ``shape`` and ``dtype``) the items'
            columns have; ``None`` accepts any item.
        max_item_bytes: (rlreplay) without a signature, items are kept serialized in rows
            of this many bytes; an item larger than that is refused.

    Raises:
        InvalidArgumentError (a ValueError): naming the argument, for an empty name,
            ``max_size < 1``, a selector or limiter that is not one, extensions, or a
            signature leaf that is not a spec.
    """

    def __init__(
        self,
        name: str,
        sampler: Any,
        remover: Any,
        max_size: int,
        rate_limiter: Any,
        max_times_sampled: int = 0,
        extensions: Sequence[Any] = (),
        signature: Any = None,
        *,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
    ):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name={describe(name)} must be a non-empty string")
        if name == META_TABLE:
            raise InvalidArgumentError(f"name={name!r} is reserved; choose another name")
        if not is_int(max_size) or max_size < 1:
            raise InvalidArgumentError(
                f"max_size ({describe(max_size)}) must be a positive integer"
            )
        if not is_int(max_times_sampled) or max_times_sampled < 0:
            raise InvalidArgumentError(
                f"max_times_sampled={describe(max_times_sampled)} must be an int >= 0 (0: never)"
            )
        if extensions:
            raise InvalidArgumentError(
                f"extensions={describe(extensions)}: rlreplay tables run no extensions; "
                "leave extensions out"
            )
        if not is_int(max_item_bytes) or max_item_bytes < 64:
            raise InvalidArgumentError(
                f"max_item_bytes={describe(max_item_bytes)} must be an int >= 64"
            )
        self._sampler = item_selectors.check_selector("sampler", sampler)
        self._remover = item_selectors.check_selector("remover", remover)
        self._rate_limiter = rate_limiters.check_rate_limiter(rate_limiter)
        self._max_size = int(max_size)
        self._max_times_sampled = int(max_times_sampled)
        self._signature = signature
        flat = None if signature is None else specs.check_signature(signature)
        self._format = ItemFormat(flat, max_item_bytes)
        fifo_only = isinstance(self._remover, item_selectors.Fifo) and max_times_sampled == 0
        # One row per item, in the store's ring of rows. With a Fifo remover (and items
        # never used up) the ring's oldest row holds the oldest item, the one Fifo evicts:
        # max_size + 1 rows, an overwritten row's item evicted. Otherwise a live item can
        # sit on the oldest row; it is moved to the ring's head (a new key) rather than
        # lost, which needs room for max_size items beside an insert of up to max_size.
        if fifo_only:
            capacity, on_overwrite = self._max_size + 1, "evict"
        else:
            capacity, on_overwrite = 2 * self._max_size + 1, "relocate"
        self._name = name
        rr_sampler, rr_remover = self._sampler.build(), self._remover.build()
        # Reverb keeps (and reports) every item's priority whatever its selectors; an
        # rlreplay table keeps them when a selector says it uses them.
        rr_remover.uses_priorities = True
        self._table = _rr.Table(
            name,
            signature=self._format.rlreplay_signature(),
            capacity=capacity,
            sampler=rr_sampler,
            remover=rr_remover,
            max_size=self._max_size,
            rate_limiter=self._rate_limiter.build(),
            max_times_sampled=self._max_times_sampled,
            on_overwrite=on_overwrite,
        )

    # ------------------------------------------------------------ constructors
    @classmethod
    def queue(
        cls,
        name: str,
        max_size: int,
        extensions: Sequence[Any] = (),
        signature: Any = None,
        **kwargs: Any,
    ) -> Table:
        """A FIFO queue of ``max_size`` items, each sampled once; inserts wait while it is
        full, samples while it is empty."""
        return cls(
            name,
            item_selectors.Fifo(),
            item_selectors.Fifo(),
            max_size,
            rate_limiters.Queue(max_size),
            1,
            extensions,
            signature,
            **kwargs,
        )

    @classmethod
    def stack(
        cls,
        name: str,
        max_size: int,
        extensions: Sequence[Any] = (),
        signature: Any = None,
        **kwargs: Any,
    ) -> Table:
        """A LIFO stack of ``max_size`` items, each sampled once."""
        return cls(
            name,
            item_selectors.Lifo(),
            item_selectors.Lifo(),
            max_size,
            rate_limiters.Stack(max_size),
            1,
            extensions,
            signature,
            **kwargs,
        )

    def replace(
        self,
        name: str | None = None,
        sampler: Any = None,
        remover: Any = None,
        max_size: int | None = None,
        rate_limiter: Any = None,
        max_times_sampled: int | None = None,
        extensions: Sequence[Any] | None = None,
        signature: Any = None,
    ) -> Table:
        """A new, empty table with this one's arguments, those given replaced."""
        return Table(
            name=self._name if name is None else name,
            sampler=self._sampler if sampler is None else sampler,
            remover=self._remover if remover is None else remover,
            max_size=self._max_size if max_size is None else max_size,
            rate_limiter=self._rate_limiter if rate_limiter is None else rate_limiter,
            max_times_sampled=(
                self._max_times_sampled if max_times_sampled is None else max_times_sampled
            ),
            extensions=() if extensions is None else extensions,
            signature=self._signature if signature is None else signature,
            max_item_bytes=self._format.max_item_bytes,
        )

    # ------------------------------------------------------------ reading
    @property
    def name(self) -> str:
        return self._name

    @property
    def rlreplay_table(self) -> _rr.Table:
        """The rlreplay table underneath (one row per item)."""
        return self._table

    @property
    def info(self) -> TableInfo:
        """Reverb's :class:`~rlreplay.reverb.reverb_types.TableInfo` of the table now."""
        return table_info(self.describe(), table_stats(self._table), self._signature)

    def can_sample(self, num_samples: int) -> bool:
        """Whether a sample of ``num_samples`` would proceed now without waiting."""
        return self._table.can_sample(num_samples)

    def can_insert(self, num_inserts: int) -> bool:
        """Whether ``num_inserts`` inserts would proceed now without waiting."""
        return self._table.can_insert(num_inserts)

    def describe(self) -> dict[str, Any]:
        """The table's description as clients read it (JSON-able)."""
        return {
            "name": self._name,
            "format": self._format.to_json(),
            "signature": None if self._signature is None else specs.nest_to_json(self._signature),
            "sampler": self._sampler.options(),
            "remover": self._remover.options(),
            "max_size": self._max_size,
            "max_times_sampled": self._max_times_sampled,
            "rate_limiter": self._rate_limiter.info(),
        }

    def __repr__(self) -> str:
        return (
            f"Table(name={self._name!r}, sampler={self._sampler!r}, remover={self._remover!r}, "
            f"max_size={self._max_size}, rate_limiter={self._rate_limiter!r}, "
            f"max_times_sampled={self._max_times_sampled}, signature={self._signature!r})"
        )


def table_stats(table: _rr.Table) -> dict[str, Any]:
    """The counters of ``table`` that Reverb's TableInfo reports."""
    info = table.info()
    return {
        "size": info.size,
        "inserts": info.inserts,
        "samples": info.samples,
        "sampled_items": info.sampled_items,
    }


def _meta_table(tables: list[Table]) -> _rr.Table:
    blob = json.dumps({t.name: t.describe() for t in tables}).encode()
    meta = _rr.Table(META_TABLE, signature={"json": ((len(blob),), "uint8")}, max_size=1)
    meta.insert({"json": np.frombuffer(blob, np.uint8)})
    return meta


class Server:
    """A Reverb server: serves ``tables`` on ``port`` (a free one when ``None``), in this
    process, until :meth:`stop`.

    Args:
        tables: the :class:`Table` objects (at least one, unique names).
        port: TCP port on the loopback interface (``None``: a free one).
        checkpointer: a :class:`~rlreplay.reverb.checkpointers.DefaultCheckpointer`
            naming the directory :meth:`Client.checkpoint` saves to (and this server
            restores the newest checkpoint from); default: a new temporary directory.
        bind: (rlreplay) the host to bind, loopback by default; another needs the
            options of :class:`rlreplay.Server` given as ``server_options``.
        server_options: (rlreplay) further keyword arguments of :class:`rlreplay.Server`.

    Raises:
        InvalidArgumentError (a ValueError): for no tables, tables that are not
            :class:`Table`, or duplicate names.
    """

    def __init__(
        self,
        tables: Iterable[Table] | None = None,
        port: int | None = None,
        checkpointer: Any = None,
        *,
        bind: str = "127.0.0.1",
        server_options: dict[str, Any] | None = None,
    ):
        tables = list(tables or [])
        if not tables:
            raise InvalidArgumentError("At least one table must be provided: tables=[]")
        bad = [t for t in tables if not isinstance(t, Table)]
        if bad:
            raise InvalidArgumentError(
                f"tables holds {describe(bad[0])}; give rlreplay.reverb.server.Table objects"
            )
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"Multiple items in tables have the same name: {names}")
        # Without a checkpointer, checkpoints go to a new temporary directory, as in
        # Reverb; it is removed on stop() when no checkpoint was written there.
        self._own_directory: str | None = None
        if checkpointer is None:
            directory = self._own_directory = tempfile.mkdtemp(
                prefix="rlreplay_reverb_checkpoints_"
            )
        else:
            directory = getattr(checkpointer, "path", checkpointer)
        self._tables = tables
        try:
            self._server = _rr.Server(
                [t.rlreplay_table for t in tables] + [_meta_table(tables)],
                port=port,
                bind=bind,
                checkpoint_dir=str(directory),
                **(server_options or {}),
            ).start()
        except BaseException:
            self._remove_own_directory()
            raise
        self._port = int(str(self._server.address).rsplit(":", 1)[1])

    @property
    def port(self) -> int:
        return self._port

    @property
    def rlreplay_server(self) -> Any:
        """The :class:`rlreplay.Server` underneath."""
        return self._server

    def localhost_client(self) -> Any:
        """A :class:`~rlreplay.reverb.client.Client` of this server."""
        from rlreplay.reverb.client import Client

        return Client(f"localhost:{self._port}")

    def stop(self) -> None:
        """Stop serving (waiting calls end with an error). Stopping twice does nothing.

        The temporary checkpoint directory of a server made without a checkpointer is
        removed here when it is empty; one holding checkpoints stays, for a restore.
        """
        self._server.stop()
        self._remove_own_directory()

    def _remove_own_directory(self) -> None:
        """Remove the temporary checkpoint directory this server made, if no checkpoint
        was written there (once)."""
        directory, self._own_directory = self._own_directory, None
        if directory is not None:
            with contextlib.suppress(OSError):  # not empty (checkpoints), or already gone
                os.rmdir(directory)

    def wait(self) -> None:
        """Block until the server stops; a KeyboardInterrupt stops it."""
        try:
            while not self._server.wait(timeout=1.0):
                pass
        except KeyboardInterrupt:
            self.stop()
            raise

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_server", None) is not None:
            with contextlib.suppress(Exception):
                self.stop()

    def __repr__(self) -> str:
        return f"Server(port={self._port}, tables={[t.name for t in self._tables]})"
