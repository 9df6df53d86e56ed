"""Item layouts: how an item's data is read out of the step store.

Each output field reads a column at an offset from the anchor: one step (``[B, *shape]``)
or ``length=T`` steps (``[B, T, *shape]``); ``from_end`` and ``pad`` windows depend on
each item's extent. Invariant: the anchor is the item's oldest step (offsets >= 0), so an
item can be evicted before any of its steps is overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError, check_count, describe


def _overlap(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` are the same, or one is a branch holding the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_signature(signature: object) -> Signature:
    """``signature`` as a :class:`Signature`; a dict of field specs is converted."""
    if isinstance(signature, Signature):
        return signature
    if isinstance(signature, Mapping):
        return Signature(signature)
    raise InvalidArgumentError(
        f"signature={describe(signature)} must be a Signature (e.g. store.signature) or a "
        "dict of field specs such as {'obs': ((4,), 'float32'), 'reward': 'float32'}"
    )


@dataclass(frozen=True)
class Window:
    """One output field: ``length`` steps of ``column`` starting ``offset`` after the anchor."""

    column: str
    offset: int = 0
    length: int | None = None
    from_end: bool = False
    pad: bool = False

    @property
    def end(self) -> int:
        """One past the last step offset this window reads."""
        return self.offset + (1 if self.length is None else self.length)

    @property
    def variable(self) -> bool:
        """Whether the window depends on the item's own extent."""
        return self.from_end or self.pad


class ItemLayout:
    """Mapping of output field name to :class:`Window` over a signature's columns.

    Args:
        windows: output field name to :class:`Window`.
        signature: the store's signature (a dict of field specs is converted).
        mask_field: for ``pad`` windows, the output name of the ``[B, T]`` bool mask.
        span: most steps one item may cover (default: the furthest step any window reads).

    Raises:
        InvalidArgumentError: for unknown columns, negative offsets, lengths < 1, or a bad
            ``signature``.
    """

    def __init__(
        self,
        windows: Mapping[str, Window],
        signature: Signature | Mapping,
        mask_field: str | None = None,
        span: int | None = None,
    ):
        signature = _as_signature(signature)
        if not isinstance(windows, Mapping) or not windows:
            raise InvalidArgumentError(
                f"windows={describe(windows)} must be a non-empty dict of output field name "
                "to Window; an item layout needs at least one output field"
            )
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
            length_ok = win.length is None or (_is_int(win.length) and win.length >= 1)
            if not (_is_int(win.offset) and win.offset >= 0 and length_ok):
                raise InvalidArgumentError(
                    f"layout field {name!r} has offset={describe(win.offset)}, "
                    f"length={describe(win.length)}; offsets must be ints >= 0 and lengths "
                    "ints >= 1 (the anchor is the oldest step)"
                )
            if win.pad and (win.length is None or win.from_end):
                raise InvalidArgumentError(
                    f"layout field {name!r} has pad=True; a padded window needs a length and "
                    "counts from the item's start (from_end=False)"
                )
        pads = {w.length for w in windows.values() if w.pad}
        if mask_field is not None and (len(pads) != 1 or mask_field in windows):
            raise InvalidArgumentError(
                f"mask_field={mask_field!r} needs padded windows of one length and a name "
                f"not used by another output field; padded lengths are {sorted(pads)}"
            )
        self.windows: dict[str, Window] = dict(windows)
        self.signature = signature
        self.mask_field = mask_field
        reach = max(w.end for w in self.windows.values())
        if span is not None and (not isinstance(span, int) or span < reach):
            raise InvalidArgumentError(
                f"span={describe(span)} must be an int >= {reach}, the furthest step a window reads"
            )
        self.span = reach if span is None else span
        self.variable = any(w.variable for w in self.windows.values())

    @property
    def is_rows(self) -> bool:
        """True when every output field is its own column at offset 0 (one step per item)."""
        return self.span == 1 and all(
            w.column == name and w.length is None for name, w in self.windows.items()
        )

    @classmethod
    def rows(cls, signature: Signature | Mapping) -> ItemLayout:
        """Each item is one stored step, returned field by field (cpprb-style rows)."""
        signature = _as_signature(signature)
        return cls({p: Window(p) for p in signature.paths}, signature)

    @classmethod
    def transition(
        cls,
        signature: Signature | Mapping,
        next_fields: tuple[str, ...] | str = ("obs",),
        next_prefix: str = "next_",
        n_step: int = 1,
    ) -> ItemLayout:
        """Every field at the anchor, plus ``next_<f>`` read ``n_step`` steps later.

        Raises:
            InvalidArgumentError: for a ``next_fields`` entry not in the signature, a
                ``next_prefix`` that names a stored field, or ``n_step`` not an int >= 1.
        """
        signature = _as_signature(signature)
        if isinstance(next_fields, str):
            next_fields = (next_fields,)
        n_step = check_count(n_step, "n_step", "next_<field> is read n_step steps later")
        windows = {p: Window(p) for p in signature.paths}
        for f in dict.fromkeys(next_fields):
            paths = [p for p in signature.paths if p == f or p.startswith(f + "/")]
            if not paths:
                raise InvalidArgumentError(
                    f"next_fields names {f!r}, which is not in the signature "
                    f"{list(signature.paths)}"
                )
            for p in paths:
                name = next_prefix + p
                if any(_overlap(name, q) for q in signature.paths):
                    raise InvalidArgumentError(
                        f"next_prefix={next_prefix!r} names the next {p!r} {name!r}, which "
                        "is also a stored field or branch: give a next_prefix no field "
                        "starts with"
                    )
                windows[name] = Window(p, offset=n_step)
        return cls(windows, signature)

    @classmethod
    def sequence(cls, signature: Signature | Mapping, length: int) -> ItemLayout:
        """Every field as ``length`` consecutive steps: ``[B, length, ...]``."""
        signature = _as_signature(signature)
        length = check_count(length, "length")
        return cls({p: Window(p, 0, length) for p in signature.paths}, signature)

    def __repr__(self) -> str:
        return f"ItemLayout(span={self.span}, {self.windows})"

    def to_json(self) -> dict:
        out: dict = {
            n: [w.column, w.offset, w.length, w.from_end, w.pad] for n, w in self.windows.items()
        }
        if self.mask_field is not None or self.variable:
            out = {"windows": out, "mask_field": self.mask_field, "span": self.span}
        return out

    @classmethod
    def from_json(cls, data: Mapping, signature: Signature | Mapping) -> ItemLayout:
        mask_field = span = None
        if "windows" in data and "span" in data:
            data, mask_field, span = data["windows"], data["mask_field"], data["span"]
        return cls({n: Window(*w) for n, w in data.items()}, signature, mask_field, span)
