"""Reverb's Python API, without TensorFlow, on rlreplay's tables, server and client.

Code written for Reverb runs after one line::

    import rlreplay.reverb as reverb            # or, for code that says `import reverb`:
    rlreplay.reverb.install_as_reverb()         # registers this package as `reverb`

Module layout as Reverb's: :mod:`~rlreplay.reverb.server` (``Server``, ``Table``),
:mod:`~rlreplay.reverb.client` (``Client``, ``Writer``),
:mod:`~rlreplay.reverb.item_selectors` (also ``selectors``),
:mod:`~rlreplay.reverb.rate_limiters`, :mod:`~rlreplay.reverb.errors`,
:mod:`~rlreplay.reverb.trajectory_writer`, :mod:`~rlreplay.reverb.replay_sample`,
:mod:`~rlreplay.reverb.trajectory_dataset`, :mod:`~rlreplay.reverb.timestep_dataset`.
Specs are any objects with ``shape`` and ``dtype``, such as :class:`TensorSpec`. What
differs from Reverb, and why: ``docs/coming_from_reverb.md``.
"""

from __future__ import annotations

import sys

from rlreplay.reverb import (
    checkpointers,
    client,
    errors,
    item_selectors,
    pybind,
    rate_limiters,
    replay_sample,
    reverb_types,
    server,
    specs,
    timestep_dataset,
    trajectory_dataset,
    trajectory_writer,
)
from rlreplay.reverb import item_selectors as selectors
from rlreplay.reverb.client import Client, Writer
from rlreplay.reverb.errors import DeadlineExceededError, ReverbError
from rlreplay.reverb.replay_sample import ReplaySample, SampleInfo
from rlreplay.reverb.server import Server, Table
from rlreplay.reverb.specs import TensorSpec
from rlreplay.reverb.timestep_dataset import TimestepDataset
from rlreplay.reverb.trajectory_dataset import TrajectoryDataset
from rlreplay.reverb.trajectory_writer import TrajectoryColumn, TrajectoryWriter

__version__ = "0.14.0"  # the Reverb API this layer follows

_SUBMODULES = (
    "checkpointers",
    "client",
    "errors",
    "item_selectors",
    "pybind",
    "rate_limiters",
    "replay_sample",
    "reverb_types",
    "selectors",
    "server",
    "specs",
    "timestep_dataset",
    "trajectory_dataset",
    "trajectory_writer",
)


def install_as_reverb(name: str = "reverb") -> None:
    """Register this package (and its submodules) as ``reverb`` in ``sys.modules``, so
    ``import reverb`` and ``from reverb import client, server`` find it.

    Raises:
        ImportError: if another module already holds that name (real Reverb imported
            before), which this would silently shadow.
    """
    held = sys.modules.get(name)
    this = sys.modules[__name__]
    if held is not None and held is not this:
        raise ImportError(
            f"sys.modules[{name!r}] is already {held!r}; call install_as_reverb() before "
            "anything imports Reverb, or import rlreplay.reverb under another name"
        )
    sys.modules[name] = this
    for sub in _SUBMODULES:
        sys.modules[f"{name}.{sub}"] = getattr(this, sub)


__all__ = [
    "Client",
    "DeadlineExceededError",
    "ReplaySample",
    "ReverbError",
    "SampleInfo",
    "Server",
    "Table",
    "TensorSpec",
    "TimestepDataset",
    "TrajectoryColumn",
    "TrajectoryDataset",
    "TrajectoryWriter",
    "Writer",
    "checkpointers",
    "client",
    "errors",
    "install_as_reverb",
    "item_selectors",
    "pybind",
    "rate_limiters",
    "replay_sample",
    "reverb_types",
    "selectors",
    "server",
    "specs",
    "timestep_dataset",
    "trajectory_dataset",
    "trajectory_writer",
]
