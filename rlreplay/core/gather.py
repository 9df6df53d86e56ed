"""Reading items whose windows depend on each item's extent (``from_end``/``pad``).

Windows of one column whose offsets turn out equal across the batch are read with one
gather, each output a view of it: outputs may share memory, so copy before writing.
"""

from __future__ import annotations

import numpy as np

from rlreplay.core.layout import ItemLayout, Window
from rlreplay.core.storage import StepStore


def _first(win: Window, extent: np.ndarray) -> np.ndarray:
    """Per-item first step offset of a window."""
    size = 1 if win.length is None else win.length
    if win.from_end:
        return extent - size - win.offset
    return np.full(len(extent), win.offset, dtype=np.int64)


def gather_variable(
    store: StepStore, layout: ItemLayout, slots: np.ndarray, extents: np.ndarray
) -> dict[str, np.ndarray]:
    """Gather ``layout``'s outputs for items anchored at ``slots`` with ``extents``."""
    lanes, cap = store.lanes, store.capacity
    extent = extents.astype(np.int64)
    out: dict[str, np.ndarray] = {}
    mask = None
    by_column: dict[str, list[tuple[str, Window, np.ndarray]]] = {}
    for name, win in layout.windows.items():
        first = _first(win, extent)
        if not win.pad and len(first) and (first == first[0]).all():
            by_column.setdefault(win.column, []).append((name, win, first))
            continue
        size = 1 if win.length is None else win.length
        steps = first[:, None] + np.arange(size)
        if win.pad:
            valid = steps < extent[:, None]
            steps = np.minimum(steps, extent[:, None] - 1)
        rows = (slots[:, None] + steps * lanes) % cap
        col = store.columns[win.column]
        data = col[rows[:, 0]] if win.length is None else col[rows]
        if win.pad:
            data[~valid] = 0
            mask = valid
        out[name] = data
    for column, wins in by_column.items():
        col = store.columns[column]
        starts = [int(first[0]) for _, _, first in wins]
        ends = [s + (1 if w.length is None else w.length) for s, (_, w, _) in zip(starts, wins)]
        lo, hi = min(starts), max(ends)
        if len(wins) == 1 or hi - lo > sum(e - s for s, e in zip(starts, ends)):
            for (name, win, _), s, e in zip(wins, starts, ends):
                rows = (slots[:, None] + np.arange(s, e) * lanes) % cap
                out[name] = col[rows[:, 0]] if win.length is None else col[rows]
            continue
        block = col[(slots[:, None] + np.arange(lo, hi) * lanes) % cap]
        for (name, win, _), s, e in zip(wins, starts, ends):
            out[name] = block[:, s - lo] if win.length is None else block[:, s - lo : e - lo]
    if layout.mask_field is not None:
        out[layout.mask_field] = mask
    return out
