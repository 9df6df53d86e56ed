"""Versioned weights: the learner publishes, actors pull.

In process through :class:`Weights`; across processes as the one item of a server table
(:func:`weights_table`) read by :class:`RemoteWeights`. Invariant: versions only grow, by
one per publication from 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.core.rate_limiters import MinSize
from rlreplay.core.selectors import Fifo, Uniform
from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError, ReplayTimeoutError, describe

VERSION_FIELD = "weights_version"
WEIGHTS_TABLE = "weights"
_POLL_S = 0.01


@dataclass(frozen=True)
class WeightsSnapshot:
    """Published weights: ``params`` (read-only numpy arrays by name) and their ``version``."""

    version: int
    params: Mapping[str, np.ndarray]


def check_params(params: Any) -> dict[str, np.ndarray]:
    """``params`` as a dict of read-only numpy array copies (InvalidArgumentError otherwise)."""
    if not isinstance(params, Mapping) or not params:
        raise InvalidArgumentError(
            f"params={describe(params)} must be a non-empty dict of name -> numpy array "
            "(e.g. {k: v.numpy() for k, v in net.state_dict().items()})"
        )
    out = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"params name {describe(name)} must be a non-empty str")
        array = np.array(value, copy=True)
        if array.dtype.kind not in "biufc":
            raise InvalidArgumentError(
                f"params[{name!r}]={describe(value)} is not numeric (dtype {array.dtype}); "
                "give numpy arrays of numbers"
            )
        array.flags.writeable = False
        out[name] = array
    return out


class Weights:
    """The in-process carrier: publish replaces a shared reference, pull reads it.

    Thread-safe; readers never see a half-published set. Example:
        >>> w = Weights()
        >>> w.publish({"w": np.zeros(3)}).version
        0
        >>> w.latest().version
        0
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: WeightsSnapshot | None = None
        self._closed = False

    def publish(self, params: Mapping[str, np.ndarray]) -> WeightsSnapshot:
        """Publish ``params`` (copied) as the next version and wake waiting actors."""
        checked = check_params(params)
        with self._cond:
            version = 0 if self._latest is None else self._latest.version + 1
            self._latest = WeightsSnapshot(version, checked)
            self._cond.notify_all()
            return self._latest

    def latest(self) -> WeightsSnapshot | None:
        """The newest published weights (``None`` before the first publication)."""
        return self._latest

    def wait_for(self, min_version: int, timeout: float) -> WeightsSnapshot:
        """The newest weights once their version is at least ``min_version``; blocks up to
        ``timeout`` s (then ReplayTimeoutError), ClosedError if the run stops meanwhile."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._latest is None or self._latest.version < min_version:
                if self._closed:
                    raise ClosedError("the run stopped while waiting for new weights")
                left = deadline - time.monotonic()
                if left <= 0:
                    have = None if self._latest is None else self._latest.version
                    raise ReplayTimeoutError(
                        f"no weights of version >= {min_version} were published within "
                        f"{timeout}s (newest: {have}); the learner is not publishing (is it "
                        "receiving batches?) or max_policy_lag is too strict"
                    )
                self._cond.wait(min(left, 0.1))
            return self._latest

    def close(self) -> None:
        """Wake every waiting actor with :class:`ClosedError`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def weights_table(params: Mapping[str, np.ndarray]) -> Table:
    """The server-side carrier: a table holding one item, the newest weights.

    Columns are the params' arrays (names without ``/``) plus the version; publishing evicts
    the previous row."""
    params = check_params(params)
    signature = {name: (a.shape, a.dtype.str) for name, a in params.items()}
    signature[VERSION_FIELD] = "int64"
    return Table(
        WEIGHTS_TABLE,
        signature=signature,
        capacity=4,
        max_size=1,
        sampler=Uniform(),
        remover=Fifo(),
        rate_limiter=MinSize(1),
    )


class TableWeights(Weights):
    """:class:`Weights` also kept in a :func:`weights_table` for other processes."""

    def __init__(self, table: Table) -> None:
        super().__init__()
        self.table = table

    def publish(self, params: Mapping[str, np.ndarray]) -> WeightsSnapshot:
        snapshot = super().publish(params)
        row = {name: a[None] for name, a in snapshot.params.items()}
        row[VERSION_FIELD] = np.array([snapshot.version], dtype=np.int64)
        self.table.insert(row, timeout=5.0)
        return snapshot


class RemoteWeights:
    """The actor side across processes: pulls the weights table through a client, transferring
    arrays only when a newer version was published."""

    def __init__(self, client: Any, table: str = WEIGHTS_TABLE, stop: Any = None) -> None:
        self.stop = stop  # an event: waiting ends with ClosedError once it is set
        self.client = client
        self.table = table
        self._latest: WeightsSnapshot | None = None

    def latest(self) -> WeightsSnapshot | None:
        """The newest published weights (fetched when the server has newer ones)."""
        published = self.client.info(self.table).inserts - 1
        if published >= 0 and (self._latest is None or published > self._latest.version):
            batch = self.client.sample(self.table, 1, timeout=5.0)
            params = {k: v[0] for k, v in batch.data.items() if k != VERSION_FIELD}
            for array in params.values():
                array.flags.writeable = False
            version = int(batch.data[VERSION_FIELD][0])
            self._latest = WeightsSnapshot(version, params)
        return self._latest

    def wait_for(self, min_version: int, timeout: float) -> WeightsSnapshot:
        """As :meth:`Weights.wait_for`, polling the server; ClosedError once ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while True:
            latest = self.latest()
            if latest is not None and latest.version >= min_version:
                return latest
            if self.stop is not None and self.stop.is_set():
                raise ClosedError("the run stopped while waiting for new weights")
            if time.monotonic() >= deadline:
                have = None if latest is None else latest.version
                raise ReplayTimeoutError(
                    f"no weights of version >= {min_version} reached this actor within "
                    f"{timeout}s (newest: {have}); the learner is not publishing"
                )
            time.sleep(_POLL_S)
