"""Saving and restoring one table: the :class:`~rlreplay.core.table.Table` methods
``table.checkpoint(path)`` and ``Table.restore(path)``.

They are the one-table spelling of :mod:`rlreplay.checkpoint` (which saves and restores
every table over a store, with the store's steps); ``Table`` binds these functions as its
method and classmethod (``restore`` takes the class first), so a table reaches the
checkpoint package only when it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlreplay.errors import InvalidArgumentError, describe

if TYPE_CHECKING:
    from rlreplay.core.table import Table


def checkpoint(table: Table, path: Any, *, keep: int | None = None, progress: bool = False) -> Any:
    """Save this table and its store as a new checkpoint under directory ``path``;
    returns the checkpoint's directory (a ``pathlib.Path``). Other threads keep
    using the table meanwhile. See :func:`rlreplay.checkpoint.save` (``keep``: how
    many newest checkpoints to keep; its errors)."""
    from rlreplay.checkpoint import save

    return save(table, path, keep=keep, progress=progress)


def restore(
    cls: type[Table],
    path: Any,
    *,
    name: str | None = None,
    into: Table | None = None,
    adapt: bool = False,
    mmap: bool = False,
    verify: bool | None = None,
    progress: bool = False,
) -> Table:
    """The table saved at ``path`` (a checkpoint, or the newest valid one in a
    directory of them): built from the checkpoint, or loaded ``into`` a table you
    built, whose definition is checked against it. ``name`` picks one of several
    tables. See :func:`rlreplay.checkpoint.restore` for the other arguments.

    Raises:
        InvalidArgumentError: if the checkpoint holds several tables and ``name`` is
            not one of them; and as :func:`rlreplay.checkpoint.restore`.
    """
    from rlreplay.checkpoint import restore as restore_tables

    options = {"adapt": adapt, "mmap": mmap, "verify": verify, "progress": progress}
    if into is not None:
        return restore_tables(path, into, **options)[into.name]
    tables = restore_tables(path, **options)
    if name is None and len(tables) == 1:
        return next(iter(tables.values()))
    if name not in tables:
        raise InvalidArgumentError(
            f"name={describe(name)}: the checkpoint holds tables {sorted(tables)}; "
            "pass name= one of them (or use rlreplay.checkpoint.restore for all)"
        )
    return tables[name]
