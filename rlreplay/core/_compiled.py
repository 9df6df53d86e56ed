"""Loading the optional compiled kernels.

The package's install builds small C extensions (``rlreplay/core/_draws.c``,
``rlreplay/core/selectors/_sumtree.c``) when a C compiler is present. Each has a numpy
equivalent, used when the kernel was not built or when the environment variable
``RLREPLAY_NO_EXTENSION=1`` is set at import (tests run both paths and compare them).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load_kernel(module: str) -> ModuleType | None:
    """The compiled module ``module``, or ``None`` when it is not built or disabled."""
    if os.environ.get("RLREPLAY_NO_EXTENSION", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:  # not built (no compiler at install): the numpy path serves
        return None
