"""Versioned weights: the learner publishes, actors pull.

One mechanism with two carriers. :class:`Weights` is the in-process one: a shared
reference to the newest published arrays under a condition variable. Across processes the
same arrays travel through the replay server as the one item of a small table
(:func:`weights_table`), so they cross the wire as typed numpy columns, never as pickles;
:class:`RemoteWeights` is the actor side of that table.

Invariant: versions only grow. Version 0 is the initial weights, published before any
actor starts, and every publication is one version more, so ``learner version -
policy_version`` of a sampled step is how many publications it is behind.
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
    """``params`` as a dict of read-only numpy arrays (copies of what was given).

    Raises:
        InvalidArgumentError: if ``params`` is not a non-empty mapping of names to arrays.
    """
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

    Thread-safe; readers never see a half-published set (a publication swaps one
    reference). Example:
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
        """Publish ``params`` (copied) as the next version and wake waiting actors.

        Raises:
            InvalidArgumentError: for params that are not a dict of arrays.
        """
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
        """The newest weights once their version is at least ``min_version``.

        Raises:
            ReplayTimeoutError: if no such version is published within ``timeout`` s.
            ClosedError: if the run stopped while waiting.
        """
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

    Its columns are the params' arrays (names may hold any character but ``/``) plus the
    version; publishing inserts a row, which evicts the previous one.
    """
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
    """:class:`Weights` that also keep the newest set in a :func:`weights_table`, so
    actors in other processes can pull them through the server."""

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
    """The actor side across processes: pulls the weights table through a client.

    A pull first asks the table's insert count (a few bytes) and transfers the arrays
    only when a newer version was published.
    """

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
        """As :meth:`Weights.wait_for`, polling the server.

        Raises:
            ReplayTimeoutError: if no such version is published within ``timeout`` s.
            ClosedError: if ``stop`` was set while waiting.
        """
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
