"""Nested structures (dicts, lists, tuples, namedtuples) as Reverb reads them.

Leaves are everything else (arrays, scalars, specs, ``None``). Dicts flatten in sorted key
order and namedtuples in field order, as ``dm-tree`` (which Reverb uses) does, so a nest
flattens to the same column order here as in Reverb.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Path = tuple[Any, ...]


def is_namedtuple(x: object) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _children(x: Any) -> list[tuple[Any, Any]] | None:
    """``(key, child)`` pairs of a branch in flattening order; ``None`` for a leaf."""
    if isinstance(x, Mapping):
        try:
            keys = sorted(x)
        except TypeError:  # keys of mixed types: insertion order
            keys = list(x)
        return [(k, x[k]) for k in keys]
    if is_namedtuple(x):
        return list(zip(type(x)._fields, x))
    if isinstance(x, (list, tuple)):
        return list(enumerate(x))
    return None


def flatten(x: Any) -> list[Any]:
    """The leaves of ``x`` in Reverb's order."""
    children = _children(x)
    if children is None:
        return [x]
    out: list[Any] = []
    for _, child in children:
        out.extend(flatten(child))
    return out


def flatten_with_path(x: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
    """``(path, leaf)`` pairs; a path is the tuple of keys and indices down to the leaf."""
    children = _children(x)
    if children is None:
        return [(prefix, x)]
    out: list[tuple[Path, Any]] = []
    for key, child in children:
        out.extend(flatten_with_path(child, (*prefix, key)))
    return out


def _rebuild(structure: Any, values: list[Any]) -> Any:
    if isinstance(structure, Mapping):
        built = {k: v for k, v in values}
        try:
            return type(structure)((k, built[k]) for k in structure)
        except TypeError:
            return {k: built[k] for k in structure}
    if is_namedtuple(structure):
        return type(structure)(*(v for _, v in values))
    if isinstance(structure, tuple):
        return tuple(v for _, v in values)
    return [v for _, v in values]


def unflatten_as(structure: Any, flat: list[Any]) -> Any:
    """``flat`` leaves put back into the shape of ``structure``.

    Raises:
        ValueError: if ``flat`` does not hold one value per leaf of ``structure``.
    """
    flat = list(flat)
    n = len(flatten(structure))
    if n != len(flat):
        raise ValueError(
            f"the structure has {n} leaves but {len(flat)} values were given; give one "
            "value per leaf"
        )
    it = iter(flat)

    def build(node: Any) -> Any:
        children = _children(node)
        if children is None:
            return next(it)
        return _rebuild(node, [(k, build(child)) for k, child in children])

    return build(structure)


def map_structure(fn: Callable[[Any], Any], x: Any) -> Any:
    return unflatten_as(x, [fn(leaf) for leaf in flatten(x)])


def flatten_up_to(structure: Any, x: Any) -> list[Any]:
    """The values of ``x`` at the leaves of ``structure`` (``x``'s deeper parts, such as
    a shape's tuple, stay whole)."""
    children = _children(structure)
    if children is None:
        return [x]
    other = _children(x)
    if other is None or len(other) != len(children):
        raise ValueError(f"{x!r} does not have the structure of {structure!r}")
    out: list[Any] = []
    for (_, a), (_, b) in zip(children, other):
        out.extend(flatten_up_to(a, b))
    return out


def unflattener(structure: Any) -> Callable[[list[Any]], Any]:
    """A function doing :func:`unflatten_as` for ``structure``, made once: a flat dict or
    namedtuple of leaves (the common signature) is rebuilt without walking the nest."""
    children = _children(structure)
    if children is not None and all(_children(c) is None for _, c in children):
        if type(structure) is dict:
            keys = [k for k, _ in children]
            return lambda flat: dict(zip(keys, flat))
        if is_namedtuple(structure):
            cls = type(structure)
            return lambda flat: cls(*flat)
    return lambda flat: unflatten_as(structure, flat)
