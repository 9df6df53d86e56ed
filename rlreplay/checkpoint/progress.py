"""Progress of long saves and restores: a tqdm bar over bytes when asked for and installed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Progress:
    """Counts bytes done out of ``total``; a tqdm bar when ``enabled`` and tqdm is installed."""

    def __init__(self, enabled: bool, total: int, what: str):
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=what, unit="B", unit_scale=True, leave=False)

    @property
    def update(self) -> Callable[[int], None] | None:
        """The per-chunk callback (``None`` without a bar: nothing to call)."""
        return None if self._bar is None else self._bar.update

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
