"""The writer sessions of a server: which remote writers it keeps state for, and how long.

Sessions retain store steps only once their first chunk is applied, are bounded per client
(``max_per_client``) and per store (half of it), and expire when silent. Every method runs on
the dispatcher thread. A session whose first chunk was refused is kept (holding no rows), so
the chunks it sent behind it are refused too, not taken as a forgotten writer's new stream.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from rlreplay.errors import ResourceLimitError
from rlreplay.net.server.ingest import WriterSession

# Seconds a writer with no chunk waiting may stay silent before its retained steps go.
WRITER_IDLE_S = 600.0
# Seconds after which a silent writer's session is forgotten altogether.
WRITER_FORGET_S = 3600.0
MAX_WRITERS_PER_CLIENT = 64  # the Server's default ``max_writers_per_client``


class _Entry:
    __slots__ = ("client", "session", "used")

    def __init__(self, session: WriterSession, client: bytes, used: float):
        self.session, self.client, self.used = session, client, used


class WriterSessions:
    """The sessions of one server's remote writers, by writer id, least recently used
    first.

    Args:
        max_per_client: sessions one client connection may keep.
    """

    def __init__(self, max_per_client: int = MAX_WRITERS_PER_CLIENT):
        self.max_per_client = max_per_client
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self._per_client: dict[bytes, int] = {}
        self._idle_sweep = 0.0
        self.dropped = 0  # sessions closed to keep a client within max_per_client

    def __len__(self) -> int:
        """Sessions that retain steps (a chunk of theirs was applied)."""
        return sum(1 for e in self._entries.values() if e.session.registered)

    def of_client(self, client: bytes) -> int:
        """Sessions ``client`` keeps now, applied or not."""
        return self._per_client.get(client, 0)

    def get(self, key: Any, now: float) -> WriterSession | None:
        """The session of writer ``key`` (marked used at ``now``), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.used = now
        self._entries.move_to_end(key)
        return entry.session

    def add(self, key: Any, session: WriterSession, client: bytes, now: float) -> None:
        """Keep the session of a new writer of ``client`` (it retains nothing yet). At the
        client's limit, an idle session with no applied chunk is closed now; one retaining steps
        only once the new writer's first chunk applies (:meth:`first_applied`), so a refused
        chunk closes none.

        Raises:
            ResourceLimitError: if ``client`` keeps ``max_per_client`` sessions and each
                has a chunk waiting; nothing changed then.
        """
        if self._per_client.get(client, 0) >= self.max_per_client:
            idle = self._idle_of(client)
            if not idle:
                raise ResourceLimitError(
                    f"this client keeps {self.max_per_client} remote writers, each with a "
                    f"chunk waiting (the server's max_writers_per_client="
                    f"{self.max_per_client}); close writers or wait for their chunks"
                )
            unapplied = [k for k in idle if not self._entries[k].session.registered]
            if unapplied:
                self.close(unapplied[0])
                self.dropped += 1
        self._entries[key] = _Entry(session, client, now)
        self._per_client[client] = self._per_client.get(client, 0) + 1

    def _idle_of(self, client: bytes) -> list:
        """Writer ids of ``client`` with no chunk waiting, least recently used first."""
        return [k for k, e in self._entries.items() if e.client == client and not e.session.pending]

    def close(self, key: Any) -> None:
        """Forget writer ``key`` and let its retained steps go for good (if known)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        left = self._per_client[entry.client] - 1
        if left:
            self._per_client[entry.client] = left
        else:
            del self._per_client[entry.client]
        entry.session.close()

    def first_applied(self, key: Any) -> None:
        """Writer ``key``'s first chunk was applied: enforce the retention limits."""
        entry = self._entries.get(key)
        if entry is None:  # closed while its chunk waited
            return
        session, client = entry.session, entry.client
        for victim in self._idle_of(client):
            if self._per_client[client] <= self.max_per_client:
                break
            if victim != key:
                self.close(victim)
                self.dropped += 1
        store = session.store
        budget = store.capacity // 2
        others = [
            e.session
            for e in self._entries.values()
            if e.session.store is store and e.session is not session and e.session.retained
        ]
        held = sum(s.retained for s in others) + session.history
        for other in others:  # least recently used first
            if held <= budget:
                return
            if not other.pending:
                held -= other.retained
                other.release()

    def state(self) -> list[dict]:
        """Every session's state with its writer id, for a server checkpoint."""
        out = []
        for key, entry in self._entries.items():
            state = entry.session.state()
            state["id"] = key.hex() if isinstance(key, bytes) else key
            out.append(state)
        return out

    def load_state(self, states: list[dict], tables: dict[str, Any], now: float) -> None:
        """Keep the sessions :meth:`state` described, over the restored ``tables``."""
        for key in list(self._entries):
            self.close(key)
        for state in states:
            key = state["id"]
            key = bytes.fromhex(key) if isinstance(key, str) else int(key)
            session = WriterSession.from_state([tables[n] for n in state["tables"]], state)
            self._entries[key] = _Entry(session, b"", now)
            self._per_client[b""] = self._per_client.get(b"", 0) + 1

    def release_idle(self, now: float) -> None:
        """Release the steps of writers silent for ``WRITER_IDLE_S``."""
        if now - self._idle_sweep < 1.0:
            return
        self._idle_sweep = now
        for entry in self._entries.values():
            if now - entry.used <= WRITER_IDLE_S:
                break  # least recently used first: the rest were used later
            if not entry.session.pending:
                entry.session.release()

    def forget_idle(self, now: float) -> None:
        """Forget the writers silent for ``WRITER_FORGET_S`` with no chunk waiting."""
        stale = []
        for key, entry in self._entries.items():
            if now - entry.used <= WRITER_FORGET_S:
                break
            if not entry.session.pending:
                stale.append(key)
        for key in stale:
            self.close(key)
