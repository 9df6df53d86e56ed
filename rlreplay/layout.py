"""Item layouts: how an item's data is read out of the step store.

An item is an anchor step plus a layout shared by the whole table. For each output field
the layout names a source column, an offset from the anchor and a length:

* ``length=None``: one step, returned as ``[B, *shape]``;
* ``length=T``: ``T`` consecutive steps, returned as ``[B, T, *shape]``.

A transition ``(obs, action, reward, next_obs)`` reads ``obs``/``action``/``reward`` at
offset 0 and ``next_obs`` from the *same* ``obs`` column at offset 1, so each
observation is stored once. The anchor is always the item's oldest step (every offset
is >= 0), which is what lets the store evict an item before any of its steps is
overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.specs import Signature


@dataclass(frozen=True)
class Window:
    """One output field: ``length`` steps of ``column`` starting ``offset`` after the anchor."""

    column: str
    offset: int = 0
    length: int | None = None

    @property
    def end(self) -> int:
        """One past the last step offset this window reads."""
        return self.offset + (1 if self.length is None else self.length)


class ItemLayout:
    """Mapping of output field name to :class:`Window` over a signature's columns.

    Raises:
        InvalidArgumentError: for unknown columns, negative offsets or lengths < 1.
    """

    def __init__(self, windows: Mapping[str, Window], signature: Signature):
        if not windows:
            raise InvalidArgumentError("an item layout needs at least one output field")
        for name, win in windows.items():
            if not isinstance(win, Window):
                raise InvalidArgumentError(
                    f"layout field {name!r} is {describe(win)}; give a Window(column, offset, "
                    "length)"
                )
            if win.column not in signature:
                raise InvalidArgumentError(
                    f"layout field {name!r} reads column {win.column!r}, which is not in the "
                    f"signature {list(signature.paths)}"
                )
            if win.offset < 0 or (win.length is not None and win.length < 1):
                raise InvalidArgumentError(
                    f"layout field {name!r} has offset={win.offset}, length={win.length}; "
                    "offsets must be >= 0 and lengths >= 1 (the anchor is the oldest step)"
                )
        self.windows: dict[str, Window] = dict(windows)
        self.signature = signature
        self.span = max(w.end for w in self.windows.values())

    @property
    def is_rows(self) -> bool:
        """True when every output field is its own column at offset 0 (one step per item)."""
        return self.span == 1 and all(
            w.column == name and w.length is None for name, w in self.windows.items()
        )

    @classmethod
    def rows(cls, signature: Signature) -> ItemLayout:
        """Each item is one stored step, returned field by field (cpprb-style rows)."""
        return cls({p: Window(p) for p in signature.paths}, signature)

    @classmethod
    def transition(
        cls,
        signature: Signature,
        next_fields: tuple[str, ...] = ("obs",),
        next_prefix: str = "next_",
        n_step: int = 1,
    ) -> ItemLayout:
        """Every field at the anchor, plus ``next_<f>`` read ``n_step`` steps later.

        For a field path ``obs/image`` the extra output is ``next_obs/image``.
        """
        windows = {p: Window(p) for p in signature.paths}
        for f in next_fields:
            paths = [p for p in signature.paths if p == f or p.startswith(f + "/")]
            if not paths:
                raise InvalidArgumentError(
                    f"next_fields names {f!r}, which is not in the signature "
                    f"{list(signature.paths)}"
                )
            for p in paths:
                windows[next_prefix + p] = Window(p, offset=n_step)
        return cls(windows, signature)

    @classmethod
    def sequence(cls, signature: Signature, length: int) -> ItemLayout:
        """Every field as ``length`` consecutive steps: ``[B, length, ...]``."""
        if not isinstance(length, int) or length < 1:
            raise InvalidArgumentError(f"length={describe(length)} must be an int >= 1")
        return cls({p: Window(p, 0, length) for p in signature.paths}, signature)

    def output_shape(self, name: str) -> tuple[int, ...]:
        win = self.windows[name]
        shape = self.signature[win.column].shape
        return shape if win.length is None else (win.length, *shape)

    def __repr__(self) -> str:
        return f"ItemLayout(span={self.span}, {self.windows})"

    def to_json(self) -> dict:
        return {n: [w.column, w.offset, w.length] for n, w in self.windows.items()}

    @classmethod
    def from_json(cls, data: Mapping, signature: Signature) -> ItemLayout:
        return cls({n: Window(c, o, ln) for n, (c, o, ln) in data.items()}, signature)
