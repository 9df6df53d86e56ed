"""What pipelined inserts hold per message, and the receipts a caller gets for its rows.

An :class:`InsertBatch` is the rows of one insert message: held in this process
(``rid`` None), sent, then acknowledged (``keys``) or refused (``error``). An
:class:`InsertReceipt` names a caller's rows within one batch and waits for them through
the thread's :class:`~rlreplay.net.inserts.InsertPipeline`, which alone sends, receives
and resolves batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlreplay.errors import ReplayError
from rlreplay.net.insert_rows import InsertPlan

if TYPE_CHECKING:
    from rlreplay.net.inserts import InsertPipeline


class InsertBatch:
    """Rows of one message: held (``rid`` None), sent, then acknowledged or failed."""

    __slots__ = ("arrays", "error", "keys", "n", "parts", "plan", "prio", "prios", "reported",
                 "rid", "timeout")  # fmt: skip

    def __init__(self, plan: InsertPlan, timeout: float | None, prio: bool):
        self.plan, self.timeout, self.prio = plan, timeout, prio
        self.parts: list[list] = [[] for _ in plan.fields]
        self.prios: list[float] = []
        self.arrays: dict | None = None  # a batched call's own arrays (never coalesced)
        self.n = 0
        self.rid: int | None = None
        self.keys: np.ndarray | None = None
        self.error: ReplayError | None = None
        self.reported = False

    def wire_arrays(self) -> dict[str, np.ndarray]:
        if self.arrays is not None:
            return self.arrays
        out = {}
        n = self.n
        for parts, (path, shape, dtype, _) in zip(self.parts, self.plan.fields):
            if shape:
                out["data/" + path] = np.frombuffer(b"".join(parts), dtype).reshape(n, *shape)
            else:
                out["data/" + path] = np.array(parts, dtype=dtype)
        if self.prio:
            out["priorities"] = np.array(self.prios, dtype=np.float64)
        return out


class InsertReceipt:
    """What a pipelined :meth:`Client.insert` returns: its rows, acknowledged later.

    ``keys()`` waits for the acknowledgement and returns the rows' keys (or raises the
    error that kept them out); ``done()`` says whether it arrived. Waiting for a receipt
    sends the rows still held first. A receipt is waited for in the thread that inserted.
    """

    __slots__ = ("_batch", "_pipeline", "_start", "_stop")

    def __init__(self, pipeline: InsertPipeline, batch: InsertBatch, start: int, stop: int):
        self._pipeline, self._batch, self._start, self._stop = pipeline, batch, start, stop

    def done(self) -> bool:
        """Whether the server answered (acknowledged, or refused) these rows.

        Raises:
            InvalidArgumentError: if called from another thread than the insert's (the
                answers arrive on that thread's socket, which only it may read).
        """
        b = self._batch
        self._pipeline.check_thread()
        if b.keys is None and b.error is None and b.rid is not None:
            self._pipeline.collect()
        return b.keys is not None or b.error is not None

    def keys(self, timeout: float | None = None) -> np.ndarray:
        """The rows' keys, waiting up to ``timeout`` seconds (``None``: while the server
        answers pings) for the acknowledgement.

        Raises:
            ReplayTimeoutError: if it did not arrive in time (the rows may still be stored;
                ask again).
            the error that kept the rows out (RateLimiterTimeoutError,
                ServerUnavailableError, InvalidArgumentError, ...).
            InvalidArgumentError: if called from another thread than the insert's.
        """
        self._pipeline.wait_for(self._batch, timeout)
        b = self._batch
        if b.error is not None:
            b.reported = True
            raise b.error
        return b.keys[self._start : self._stop]

    def __len__(self) -> int:
        return self._stop - self._start

    def __repr__(self) -> str:
        state = "done" if self._batch.keys is not None else "pending"
        if self._batch.error is not None:
            state = f"failed: {type(self._batch.error).__name__}"
        rows = self._stop - self._start
        return f"InsertReceipt({rows} rows of {self._batch.plan.name!r}, {state})"
