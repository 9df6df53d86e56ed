"""Sample rounds over shards: one batch's requests to every shard in flight at once, merged."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.distributed.shard_deadline import Deadline, greet
from rlreplay.distributed.shard_draws import ShardState, check_samplers, merge, split
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.errors import (
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    ServerUnavailableError,
)
from rlreplay.net.wire.payloads import update_arrays

Updates = dict[int, tuple[np.ndarray, np.ndarray]]
_POLL_S = (0.005, 0.1)  # first and longest pause between polls while no shard holds items


@dataclass
class Round:
    """One batch's requests and what came back so far.

    Attributes:
        shares: the ``q_s`` the batch is drawn with.
        asked: per shard with a request out, how many items it asked (0: state only).
        parts: ``(shard, reply arrays)`` of the parts drawn so far.
        held: per shard whose rate limiter held its part back, the items still to come.
        lost: items that down shards were to draw (drawn again elsewhere).
        excluded: shards left out of this batch because their limiters held them back.
    """

    batch_size: int
    timeout: float | None
    until: float | None
    shares: np.ndarray
    asked: dict[int, int] = field(default_factory=dict)
    rids: dict[int, int] = field(default_factory=dict)
    parts: list[tuple[int, dict]] = field(default_factory=list)
    held: dict[int, int] = field(default_factory=dict)
    lost: int = 0
    excluded: set[int] = field(default_factory=set)
    error: BaseException | None = None


class ShardedSampler:
    """Draws batches of one table over all shards; threads may share it (``_lock`` guards the
    split's random generator, the shards' states and the held rounds).

    Args:
        table: the table's name on every shard.
        shards: one :class:`~rlreplay.Client` per shard.
        keys: the key translation of the sharded client.
        health: the shard-down policy and the shards taken for down.
        rng: draws the splits and the batches' order.
    """

    def __init__(
        self,
        table: str,
        shards: list,
        keys: ShardKeys,
        health: ShardHealth,
        rng: np.random.Generator,
    ):
        self.table = table
        self.shards = shards
        self.keys = keys
        self.health = health
        self.rng = rng
        self.states = [ShardState() for _ in shards]
        self._sampler: dict | None = None  # the sampler config every shard must have
        self._known: set[int] = set()  # shards whose state was heard since they came up
        self._held: Round | None = None  # a batch a limiter held back, for the next call
        self._lock = threading.Lock()

    def send(
        self,
        batch_size: int,
        deadline: Deadline,
        updates: Updates | None = None,
        *,
        shares: np.ndarray | None = None,
    ) -> Round:
        """Send one round's requests within the call's ``deadline``.

        Args:
            shares: split with these shares instead of the latest masses.

        Raises:
            RateLimiterTimeoutError: if no shard held an item for ``timeout`` seconds.
            ShardUnavailableError: as the policy says.
        """
        updates = dict(updates or {})
        if shares is None:
            shares = self._shares(batch_size, deadline, updates)
        with self._lock:
            counts = split(batch_size, shares, self.rng)
        self._greet(self.health.live(), deadline)
        rnd = Round(batch_size, deadline.timeout, deadline.until, shares)
        try:
            live = set(self.health.live())
            for shard in range(len(self.shards)):
                if shard in live:
                    self._send_one(rnd, shard, int(counts[shard]), updates.pop(shard, None))
                else:  # went down while greeted: its part is drawn over the others
                    rnd.lost += int(counts[shard])
        except BaseException:
            self.forget(rnd)
            raise
        return rnd

    def _shares(self, batch_size: int, deadline: Deadline, updates: Updates) -> np.ndarray:
        """The split's shares over the reachable shards whose credit covers a batch, if any."""
        pause = _POLL_S[0]
        until = deadline.waits_end  # the probes in flight then keep the reply grace
        while True:
            live = self.health.live()
            unknown = [s for s in live if s not in self._known]
            if unknown:
                self._probe(unknown, updates, deadline)
                live = self.health.live()
            masses = np.zeros(len(self.shards))
            credit = np.zeros(len(self.shards))
            with self._lock:
                for s in live:
                    masses[s] = self.states[s].mass
                    credit[s] = self.states[s].credit
            for admits in (credit >= batch_size, credit > 0):
                if (masses * admits).sum() > 0:
                    masses *= admits
                    break
            total = masses.sum()
            if total > 0:  # none admits any: over all, and the batch waits
                return masses / total
            if until is not None and time.monotonic() + pause > until:
                raise RateLimiterTimeoutError(
                    f"no shard of table {self.table!r} held an item it could sample within "
                    f"{deadline.timeout}s (shards {[c.address for c in self.shards]})"
                )
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S[1])
            self._known.difference_update(live)  # poll them again

    def _probe(self, shards: list[int], updates: Updates, deadline: Deadline) -> None:
        """Learn ``shards``' states, all requests in flight at once."""
        self._greet(shards, deadline)
        rnd = Round(0, None, deadline.bound, np.zeros(len(self.shards)))
        try:
            for shard in shards:
                if not self.health.is_down(shard):
                    self._send_one(rnd, shard, 0, updates.pop(shard, None))
        except BaseException:
            self.forget(rnd)
            raise
        self._collect(rnd)

    def _greet(self, shards: list[int], deadline: Deadline) -> None:
        """Open this thread's connection to each of ``shards`` not yet greeted."""
        greet(self.shards, shards, deadline, self._down)

    def _send_one(self, rnd: Round, shard: int, k: int, update: Any = None) -> None:
        """Ask ``shard`` for ``k`` items (0: its state), carrying ``update``."""
        header: dict[str, Any] = {"op": "sample" if k else "sampler_state", "table": self.table}
        if k:
            header["batch_size"] = k
        arrays = update_arrays(*update, prefix="update/") if update is not None else None
        tr = self.shards[shard].transport
        try:
            if k:
                # ``expires``: a late reply's items would be counted as sampled and never delivered.
                rid = tr.send(
                    header, arrays, until=rnd.until, expires=rnd.until, timeout=rnd.timeout
                )
            else:
                rid = tr.send(header, arrays, until=rnd.until)
        except ServerUnavailableError as error:
            self._down(shard, error)
            rnd.lost += k  # drawn again over the others (see finish)
            return
        rnd.rids[shard], rnd.asked[shard] = rid, k

    def _down(self, shard: int, error: ServerUnavailableError) -> None:
        self.health.failed(shard, error)  # raises under "fail"
        with self._lock:
            self.states[shard] = ShardState()
            self._known.discard(shard)

    def _collect(self, rnd: Round) -> None:
        """Every reply of ``rnd``, sorted into ``parts``, ``held`` and ``lost``."""
        pending = dict(rnd.rids)
        rnd.rids.clear()
        try:
            for shard, rid in list(pending.items()):
                del pending[shard]
                client = self.shards[shard]
                k = rnd.asked.pop(shard)
                # Take replies already arrived first, so a silent shard cannot use up the deadline.
                client.transport.channel().receive()
                try:
                    header, arrays = client.transport.wait_until(rid, rnd.until)
                except ServerUnavailableError as error:
                    self._down(shard, error)
                    rnd.lost += k
                    continue
                except ReplayTimeoutError as error:  # its limiter held the part back
                    if k:
                        rnd.held[shard] = k
                        rnd.error = rnd.error or error
                    continue
                self.health.answered(shard)
                self._observe(shard, header)
                if k:
                    rnd.parts.append((shard, arrays))
        finally:
            for shard, rid in pending.items():  # an error left these unread
                self.shards[shard].transport.forget([rid])

    def _observe(self, shard: int, header: dict) -> None:
        """Take a reply's state, checking a shard's first (InvalidArgumentError if it differs)."""
        config = header.get("sampler")
        if config is not None:
            client = self.shards[shard]
            self.keys.check_capacity(int(header["store_capacity"]), self.table, client.address)
            with self._lock:
                first = self._sampler = self._sampler or config
            check_samplers([first, config], self.table, [self.shards[0].address, client.address])
            with self._lock:
                self._known.add(shard)
        with self._lock:
            self.states[shard].observe(header)

    def finish(self, rnd: Round, deadline: Deadline) -> Sample:
        """Wait for ``rnd``'s replies within ``deadline`` and merge them into one batch.

        Raises:
            RateLimiterTimeoutError: if a shard's limiter held its part back for ``timeout``;
                finishing again asks only those shards.
            ShardUnavailableError: under ``"fail"``, for a silent shard; under ``"skip"``, if
                none answered.
        """
        if rnd.until is not None:  # sent by an earlier call: awaited within this one
            rnd.until = None if deadline.until is None else max(rnd.until, deadline.until)
        while True:
            if not rnd.rids and (rnd.held or rnd.lost):
                asks = self._reassign_held(rnd, deadline)
                if rnd.lost:  # its part is drawn again from the others, however late
                    deadline.grant_grace()
                rnd.timeout, rnd.until, rnd.error = deadline.timeout, deadline.until, None
                if rnd.lost:
                    alive = rnd.shares.copy()
                    for shard in range(len(alive)):
                        if self.health.is_down(shard) or shard in rnd.excluded:
                            alive[shard] = 0.0
                    if not alive.sum() > 0:  # nothing drawn survives: a new batch
                        return self.finish(self.send(rnd.batch_size, deadline), deadline)
                    rnd.shares = alive / alive.sum()
                    with self._lock:
                        again = split(rnd.lost, rnd.shares, self.rng)
                    rnd.lost = 0
                    for shard in np.flatnonzero(again).tolist():
                        asks[shard] = asks.get(shard, 0) + int(again[shard])
                self._greet(list(asks), deadline)
                for shard, k in asks.items():
                    self._send_one(rnd, shard, k)
            self._collect(rnd)
            if rnd.held:
                raise rnd.error  # type: ignore[misc]
            if not rnd.lost:
                return merge(rnd.parts, rnd.shares, self.states, self.keys.to_global, self.rng)

    def _reassign_held(self, rnd: Round, deadline: Deadline) -> dict[int, int]:
        """For each part held back, ask its shard again or draw it over the others (any live
        shard, in the round's split or not: re-asking one shard would stall the others)."""
        held, rnd.held = rnd.held, {}
        if not held:
            return {}
        self._probe(list(held), {}, deadline)  # their credits now
        asks = {}
        for shard, k in held.items():
            others = [
                o for o in range(len(self.shards))
                if o != shard and o not in rnd.excluded and not self.health.is_down(o)
            ]
            if self.states[shard].credit >= k or not others:
                asks[shard] = k
            else:  # conditioned on the other shards: none of its items may stay either
                rnd.excluded.add(shard)
                kept = [(o, a) for o, a in rnd.parts if o != shard]
                rnd.lost += k + sum(len(a["keys"]) for o, a in rnd.parts if o == shard)
                rnd.parts = kept
        return asks

    def sample(self, batch_size: int, deadline: Deadline, updates: Updates | None) -> Sample:
        """One batch within ``deadline``; a batch held back is completed by the next call."""
        with self._lock:
            rnd, self._held = self._held, None
        if rnd is None or rnd.batch_size != batch_size:
            rnd = self.send(batch_size, deadline, updates)
        elif updates:
            self._send_updates(updates, deadline)
        try:
            return self.finish(rnd, deadline)
        except ReplayTimeoutError as error:
            if rnd.held and not isinstance(error, ServerUnavailableError):
                with self._lock:
                    self._held = rnd
            raise

    def can_sample(self, num_samples: int, deadline: Deadline) -> bool:
        """Whether some reachable shard holding items admits ``num_samples`` now."""
        self._probe(self.health.live(), {}, deadline)
        with self._lock:
            states = list(enumerate(self.states))
        return any(
            st.mass > 0 and st.credit >= num_samples
            for s, st in states
            if not self.health.is_down(s)
        )

    def _send_updates(self, updates: Updates, deadline: Deadline) -> None:
        """Priority updates on their own, as state requests carrying them."""
        shards = [s for s in updates if not self.health.is_down(s)]
        self._probe(shards, dict(updates), deadline)

    def ready(self, shard: int) -> bool:
        """Whether ``shard`` is up and this thread's connection to it is open."""
        return not self.health.is_down(shard) and self.shards[shard].transport.channel().greeted

    def forget(self, rnd: Round) -> None:
        """Give up on ``rnd``: late replies are dropped, and shards drop parked parts."""
        for shard, rid in rnd.rids.items():
            self.shards[shard].transport.cancel([rid])
        rnd.rids.clear()


