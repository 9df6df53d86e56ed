"""Jobs: the server's calls that a rate limiter may block, and the sample replies they make.

:meth:`Job.attempt` runs the operation if the table admits it now and returns ``None``
otherwise, never waiting; the server parks such jobs and retries them when a table changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlreplay.core.selectors import Prioritized
from rlreplay.core.table import Table
from rlreplay.errors import (
    RateLimiterTimeoutError,
    ReplayTimeoutError,
)
from rlreplay.net.server.ingest import Chunk, WriterSession
from rlreplay.net.server.shm import SlotTarget

Reply = tuple[dict[str, Any], dict[str, np.ndarray] | None]


def sample_reply(table: Table, n: int, target: SlotTarget | None = None) -> Reply:
    """Sample ``n`` items now (limiter checked); with a ``target``, into shared memory."""
    if target is None:
        s = table.sample(n)
        arrays = {"data/" + k: v for k, v in s.data.items()}
    else:
        s = table.sample(n, buffers=target.buffers)
        placed, arrays = target.place(s.data)
    info = s.info
    arrays.update(
        keys=info.keys,
        probabilities=info.probabilities,
        priorities=info.priorities,
        times_sampled=np.asarray(info.times_sampled, dtype=np.int64),
    )
    header = {
        "table_size": int(info.table_size),
        "min_probability": float(info.min_probability),
        "mass": sampler_mass(table),
        "credit": sample_credit(table),
    }
    if target is not None:
        header.update(placed)
    return header, arrays


def sample_credit(table: Table) -> int:
    """The most items one sample may take from ``table`` now (lock held)."""
    lim, size = table.rate_limiter, table.index.size
    if size == 0 or not lim.can_sample(1, size):
        return 0
    low, high = 1, table.max_size
    if lim.can_sample(high, size):
        return high
    while high - low > 1:  # can_sample is monotonic in the count
        mid = (low + high) // 2
        if lim.can_sample(mid, size):
            low = mid
        else:
            high = mid
    return low


def sampler_mass(table: Table) -> float:
    """The total selection weight of ``table``'s sampler (lock held)."""
    sampler = table.index.sampler
    if isinstance(sampler, Prioritized):
        return float(sampler.sums.root)
    return float(table.index.size)


class Job:
    """A request that a rate limiter (or a full queue store) may block.

    Attributes:
        table: the table whose limiter may block it (for blocked-time accounting).
        counter: ``"insert_blocked_s"`` or ``"sample_blocked_s"``.
        deadline: ``time.monotonic()`` value after which it gets a timeout reply (or None).
    """

    counter: str | None = "insert_blocked_s"  # None: no limiter's blocked time to count
    n = 1  # items the call inserts or samples at once (for its timeout message)
    # served only to a client that can still get the reply (see parking)
    delivered_only = False

    def __init__(self, table: Table, deadline: float | None):
        self.table = table
        self.deadline = deadline
        self.parked_at: float | None = None
        self.identity: Any = None  # the requesting client, set by the server
        self.rid: Any = None

    def attempt(self) -> Reply | None:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether :meth:`attempt` would complete now (for ``delivered_only`` jobs)."""
        return True

    def may_go(self) -> bool:
        """Whether the limiter that blocked it would now admit it (store lock held)."""
        if self.counter == "insert_blocked_s":
            return self.table.admission.can_insert(self.n, 0)
        if self.counter == "sample_blocked_s":
            return self.table.admission.can_sample(self.n)
        return True

    def blocked_message(self) -> str:
        """The table's own warning for this call blocked past ``warn_after``."""
        with self.table.mutex:
            return self.table.admission.describe(self.what, self.n)

    def timeout_message(self, waited: float) -> str:
        """The table's own timeout message: its limiter's state and the likely cause."""
        with self.table.mutex:
            return self.table.admission.timeout_message(self.what, round(waited, 3), self.n)

    def timeout_error(self, waited: float) -> ReplayTimeoutError:
        """The error a call parked past its deadline is answered with."""
        return RateLimiterTimeoutError(self.timeout_message(waited))


    what = "insert"


class SampleJob(Job):
    counter = "sample_blocked_s"
    what = "sample"
    delivered_only = True  # its items (a queue's: taken once) must reach the client

    def __init__(
        self,
        table: Table,
        n: int,
        deadline: float | None,
        updated: int | None = None,
        target: SlotTarget | None = None,
    ):
        super().__init__(table, deadline)
        self.n = n
        self.updated = updated
        self.target = target  # the client's shared memory for the data, if any

    def ready(self) -> bool:
        t = self.table
        with t.mutex:
            return t.size > 0 and t.rate_limiter.can_sample(self.n, t.size)

    def attempt(self) -> Reply | None:
        t = self.table
        with t.mutex:
            if t.size > 0 and t.rate_limiter.can_sample(self.n, t.size):
                reply = sample_reply(t, self.n, self.target)
                if self.updated is not None:
                    reply[0]["updated"] = self.updated
                return reply
        return None


class InsertJob(Job):
    def __init__(self, table: Table, rows: dict, n: int, prios: Any, deadline: float | None):
        super().__init__(table, deadline)
        self.rows, self.n, self.prios = rows, n, prios

    def attempt(self) -> Reply | None:
        t = self.table
        with t.mutex:
            if t.rate_limiter.can_insert(self.n, t.size) and t.store.overwrite.has_room(self.n):
                keys = t.insert(self.rows, self.prios)
                return {}, {"keys": keys}
        return None


class WriteJob(Job):
    """One writer chunk, applied whole or not at all (see :mod:`rlreplay.net.server.ingest`).

    Chunks of one writer run strictly in arrival order; a chunk is parsed only at the head of
    its writer's queue, as its checks depend on the chunks before it.
    """

    def __init__(
        self,
        session: WriterSession,
        header: dict,
        arrays: dict,
        deadline: float | None,
        on_first_apply: Callable[[], None] | None = None,
    ):
        super().__init__(session.tables[0], deadline)
        self.session, self.header, self.arrays = session, header, arrays
        self.chunk: Chunk | None = None
        self.on_first_apply = on_first_apply  # called when it is the writer's first applied
        session.pending.append(self)

    def attempt(self) -> Reply | None:
        s = self.session
        if s.pending[0] is not self:
            return None
        first = False
        try:
            keys = s.replayed(self.header) if self.chunk is None else None
            if keys is None:
                if self.chunk is None:
                    self.chunk = s.parse(self.header, self.arrays)
                    s.check_next(self.chunk)
                first = not s.registered
                keys = s.apply(self.chunk)
        except Exception:
            self.abort()
            raise
        if keys is None:
            self.table = s.blocker
            self.n = int(self.chunk.counts[s.tables.index(s.blocker)])
            return None
        s.pending.popleft()
        if first and s.registered and self.on_first_apply is not None:
            self.on_first_apply()
        return {}, {"keys": keys}

    def ahead(self) -> WriteJob | None:
        """The writer's earlier chunk this one waits behind, if any."""
        pending = self.session.pending
        head = pending[0] if pending else None
        return head if head is not self and isinstance(head, WriteJob) else None

    def blocked_message(self) -> str:
        head = self.ahead()
        if head is None:
            return super().blocked_message()
        return f"{head.blocked_message()} (a later chunk of the same writer waits behind it)"

    def timeout_message(self, waited: float) -> str:
        head = self.ahead()
        if head is None:
            return super().timeout_message(waited)
        return (
            f"{head.timeout_message(waited)} (this chunk waited behind an earlier chunk of "
            "the same writer, held back)"
        )

    def abort(self) -> None:
        """Drop this chunk, refused or expired: nothing of it was applied."""
        s = self.session
        if self in s.pending:
            s.pending.remove(self)


