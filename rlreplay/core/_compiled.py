"""Loading the optional compiled kernels, and reporting which ones are active.

Each kernel has an equivalent with the same results, used when it is not built, fails to
import, or ``RLREPLAY_NO_EXTENSION=1`` is set at import.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

DISABLE_VARIABLE = "RLREPLAY_NO_EXTENSION"

KERNELS = (
    "rlreplay.core._store",
    "rlreplay.core._draws",
    "rlreplay.core._slots",
    "rlreplay.core.selectors._sumtree",
    "rlreplay.writers._blocks",
    "rlreplay.integrations._sb3_transitions",
)
"""Every compiled kernel, in the order :func:`kernel_status` reports them."""

NOT_BUILT = (
    "not built: no C compiler at install (reinstall with a compiler to build it: "
    "`pip install --force-reinstall --no-deps .`)"
)


@dataclass(frozen=True)
class KernelStatus:
    """Whether one compiled kernel serves this process, and why not if it does not.

    Attributes:
        module: the kernel's module name, e.g. ``"rlreplay.core._store"``.
        active: True when the compiled loops are used, False when the numpy path serves.
        reason: ``"active"``, or why the numpy path serves.
        path: the extension file when it exists, else ``None``.
    """

    module: str
    active: bool
    reason: str
    path: str | None


_loaded: dict[str, KernelStatus] = {}


def _disabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "") not in ("", "0")


def _find(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def load_kernel(module: str) -> ModuleType | None:
    """The compiled module ``module``, or ``None``; recorded for :func:`kernel_status`."""
    path = _find(module)
    if _disabled():
        _loaded[module] = KernelStatus(
            module, False, f"disabled by {DISABLE_VARIABLE}=1 at import", path
        )
        return None
    try:
        kernel = importlib.import_module(module)
    except ImportError as exc:  # not built (no compiler at install): the numpy path serves
        reason = NOT_BUILT if path is None else f"import error: {exc}"
        _loaded[module] = KernelStatus(module, False, reason, path)
        return None
    _loaded[module] = KernelStatus(module, True, "active", path)
    return kernel


def kernel_status(modules: Sequence[str] = KERNELS) -> list[KernelStatus]:
    """Which compiled kernels this process uses, one :class:`KernelStatus` per module.

    Reports the decision made at import; later changes of ``RLREPLAY_NO_EXTENSION`` do not show.

    Args:
        modules: kernel module names (default: every kernel of the package).

    Example:
        >>> [s.module for s in kernel_status()][0]
        'rlreplay.core._store'
    """
    importlib.import_module("rlreplay")  # its modules load their kernels when imported
    for module in modules:
        if module not in _loaded:
            load_kernel(module)
    return [_loaded[module] for module in modules]
