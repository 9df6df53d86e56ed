"""Wire stress: mutated requests of every kind against a real server on loopback.

Each case takes a valid request of one kind (``insert``, ``sample``, ``write``, ...),
mutates it (a header field dropped, retyped or set to an extreme value; an array renamed,
retyped, reshaped, truncated or filled with out-of-range values; the header bytes
corrupted) and sends it to a :class:`rlreplay.Server` serving in this process. A case
passes when the server answers with a typed error (or the request was valid after all),
never with an internal error; when a rejected request left every table exactly as it was
(sizes, counters, stored steps and per-item state); and when the server still serves.

Run from the repository root::

    python -m benchmarks.stress_wire [--cases 100000] [--seed 0] [--out FILE]

Prints a table (cases by request kind, replies by error kind, internal errors, crashes,
tables intact) and writes JSON to ``benchmarks/results/stress_wire.json``. The suite's
``tests/net/test_wire_fuzz.py`` drives the same mutations with hypothesis, in CI time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlreplay import EmptyTableError, ItemLayout, MinSize, Prioritized, StepStore, Table
from rlreplay.net import Server
from rlreplay.net.wire import codec

SIG = {"obs": ((3,), "float32"), "step": "int64"}
KINDS = (
    "ping",
    "describe",
    "info",
    "insert",
    "sample",
    "update_priorities",
    "delete",
    "reset",
    "can_insert",
    "can_sample",
    "write",
    "close_writer",
)
# Values a mutated header field may take: every msgpack type, and the extremes of each.
_DEEP: Any = 0
for _ in range(500):
    _DEEP = [_DEEP]
WEIRD: tuple = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    7,
    2**31,
    2**62,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    0.5,
    -0.0,
    1e300,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "x",
    "rows",
    "seq",
    "nope",
    "é" * 50,
    "x" * 5000,
    b"",
    b"\x00" * 16,
    b"\xff" * 40,
    [],
    [0],
    ["rows"],
    ["rows", "seq"],
    [1, 2, 3],
    [[1], [2]],
    {},
    {"a": 1},
    {"table": "rows"},
    _DEEP,
)
DTYPES = ("<f4", "<f8", ">f4", "<i8", ">i8", "<i4", "|u1", "|i1", "|b1", "<c8", "<u8", "<f2")
BAD_DTYPES = ("|O", "|V8", "<M8[s]", "<U4", "|S3", "", "x", "[('a', '<f4')]", "<m8")
SHAPES: tuple = (
    [],
    [0],
    [1],
    [3],
    [4, 3],
    [0, 2**62],
    [2**62, 0],
    [2**31, 2**31],
    [0, 2**31, 2**31, 2**31],  # element counts and byte sizes near and past 2**63
    [0, 2**20, 2**20, 2**20],
    [0, 2**20, 2**20, 2**19],
    [0, 2**40, 2**40],
    [2**40, 2**40, 0],
    [-1],
    [-1, -3],
    [2**63 - 1],
    [1] * 40,
    [1.5],
    ["3"],
    [None],
    3,
)
ANCHORS = (0, 1, 2, 3, 5, 7, 100, 10_000, -1, -5, 2**40, -(2**62), 2**63 - 1)


def make_tables() -> list[Table]:
    """The served tables: a prioritized row table, and a sequence and a transition table
    over one shared store (the writer's tables). No limiter blocks a non-empty table."""
    rows = Table("rows", signature=SIG, max_size=256, sampler=Prioritized(0.8), seed=0)
    store = StepStore(SIG, 512)
    seq = Table(
        "seq",
        store=store,
        layout=ItemLayout.sequence(store.signature, 3),
        rate_limiter=MinSize(1),
        seed=1,
    )
    trans = Table(
        "trans",
        store=store,
        layout=ItemLayout.transition(store.signature, n_step=1),
        sampler=Prioritized(0.6),
        seed=2,
    )
    return [rows, seq, trans]


def step_arrays(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32), "step": ids}


class Harness:
    """A server on 127.0.0.1 in this process, a raw DEALER socket to it, and the checks.

    Args:
        reply_wait_s: how long to wait for the ping that follows each case (the server
            answers requests of one connection in order, so the case's reply, if any,
            arrives before it).
    """

    def __init__(self, reply_wait_s: float = 5.0):
        self.tables = {t.name: t for t in make_tables()}
        self.server = Server(list(self.tables.values()), recheck_s=0.01).start()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.server.address)
        self.reply_wait_s = reply_wait_s
        self.rid = 1 << 40
        self.writer_seq = 0
        self.keys: dict[str, np.ndarray] = {}
        self.cases: Counter = Counter()
        self.replies: Counter = Counter()
        self.internal: list[str] = []
        self.not_intact: list[str] = []
        self.no_reply: list[str] = []
        self.refill()

    # ----------------------------------------------------------------- state
    def refill(self) -> None:
        """Give every table items (valid requests may have emptied them, or set every
        priority to 0) and remember some keys of the prioritized tables for update and
        delete requests."""
        rows = self.tables["rows"]
        if rows.size < 8:
            rows.insert(step_arrays(0, 16), np.linspace(0.5, 2.0, 16))
        self.keys["rows"] = self._keys(rows, lambda: rows.insert(step_arrays(0, 16)))
        store = self.tables["seq"].store
        for name in ("seq", "trans"):
            table = self.tables[name]
            if table.size < 4:
                first = store.append(step_arrays(store.next_id, 8))
                table.create_items(np.arange(first, first + 4))
        trans = self.tables["trans"]

        def refill_trans() -> None:
            first = store.append(step_arrays(store.next_id, 8))
            trans.create_items(np.arange(first, first + 4))

        self.keys["trans"] = self._keys(trans, refill_trans)

    @staticmethod
    def _keys(table: Table, refill: Any) -> np.ndarray:
        """Keys of a few of ``table``'s items (after emptying and refilling it when every
        priority is 0)."""
        try:
            return table.sample(4).info.keys
        except EmptyTableError:
            table.reset()
            refill()
            return table.sample(4).info.keys

    def snapshot(self) -> str:
        """A digest of everything a request could change: each table's counters and
        per-item state, and each store's steps."""
        h = hashlib.sha1()
        stores = []
        with self.tables["rows"].mutex, self.tables["seq"].mutex:
            for t in self.tables.values():
                info = t.info().to_dict()
                info.pop("insert_blocked_s")
                info.pop("sample_blocked_s")
                h.update(repr(sorted(info.items())).encode())
                for part in item_state(t):
                    h.update(np.ascontiguousarray(part).tobytes())
                if not any(t.store is s for s in stores):
                    stores.append(t.store)
            for s in stores:
                h.update(str(s.next_id).encode())
                for col in s.columns.values():
                    h.update(col.tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------- messages
    def base(self, kind: str, rng: random.Random) -> tuple[dict, dict]:
        """A valid request of ``kind``: (header, arrays)."""
        if kind in ("ping", "describe"):
            return {"op": kind}, {}
        if kind == "info":
            return ({"op": "info", "table": "rows"} if rng.random() < 0.5 else {"op": "info"}), {}
        if kind == "insert":
            n = rng.choice((1, 2, 5))
            arrays = {"data/" + k: v for k, v in step_arrays(rng.randrange(100), n).items()}
            header = {"op": "insert", "table": "rows", "timeout": 1.0}
            if rng.random() < 0.5:
                arrays["priorities"] = np.full(n, 1.5)
            else:
                header["priority"] = 0.5
            return header, arrays
        if kind == "sample":
            table = rng.choice(("rows", "seq", "trans"))
            header = {"op": "sample", "table": table, "batch_size": 4, "timeout": 1.0}
            if table == "seq" or rng.random() < 0.5:
                return header, {}
            keys = self.keys[table][:3]
            return header, {"update/keys": keys, "update/priorities": np.full(len(keys), 0.7)}
        if kind in ("update_priorities", "delete"):
            table = rng.choice(("rows", "trans"))
            keys = self.keys[table][:2]
            arrays = {"keys": keys}
            if kind == "update_priorities":
                arrays["priorities"] = np.full(len(keys), 2.0)
            return {"op": kind, "table": table}, arrays
        if kind == "reset":
            return {"op": "reset", "table": rng.choice(("rows", "seq", "trans"))}, {}
        if kind in ("can_insert", "can_sample"):
            return {"op": kind, "table": "rows", "n": 2}, {}
        if kind == "close_writer":
            return {"op": "close_writer", "writer": self._writer_id(rng)}, {}
        return self._write(rng)

    def _writer_id(self, rng: random.Random) -> bytes:
        self.writer_seq += 1
        return rng.getrandbits(64).to_bytes(8, "little") + self.writer_seq.to_bytes(8, "little")

    def _write(self, rng: random.Random) -> tuple[dict, dict]:
        n = rng.choice((4, 6))
        arrays = {"data/" + k: v for k, v in step_arrays(1000, n).items()}
        anchors = np.arange(0, n - 3, dtype=np.int64)
        arrays["item_table"] = np.zeros(len(anchors), np.int32)
        arrays["item_anchor"] = anchors
        arrays["item_priority"] = np.full(len(anchors), np.nan)
        if rng.random() < 0.5:  # a second table's items as well
            arrays["item_table"] = np.concatenate([arrays["item_table"], np.ones(2, np.int32)])
            arrays["item_anchor"] = np.concatenate([anchors, np.array([1, 2])])
            arrays["item_priority"] = np.concatenate([arrays["item_priority"], [1.0, 2.0]])
        header = {
            "op": "write",
            "writer": self._writer_id(rng),
            "tables": ["seq", "trans"],
            "history": 4,
            "seq": 0,
            "first": 0,
            "n": n,
            "episode_starts": [0],
            "timeout": 1.0,
        }
        return header, arrays

    # -------------------------------------------------------------- mutation
    def mutate(self, header: dict, arrays: dict, rng: random.Random) -> list:
        """Frames of a mutated request (one to three mutations of ``header``/``arrays``)."""
        frames = codec.encode(dict(header), arrays)
        head = msgpack.unpackb(frames[0], raw=False)
        for _ in range(rng.choice((1, 1, 2, 3))):
            what = rng.random()
            if what < 0.4 or not head.get("arrays"):
                self._mutate_field(head, rng)
            elif what < 0.65:
                self._mutate_entry(head, frames, rng)
            else:
                self._mutate_values(head, frames, rng)
        try:
            frames[0] = msgpack.packb(head, use_bin_type=True)
        except (ValueError, TypeError, OverflowError):
            frames[0] = msgpack.packb({"v": 2, "op": head.get("op"), "bad": 1})
        if rng.random() < 0.03:  # raw header corruption
            raw = bytearray(frames[0])
            for _ in range(rng.randint(1, 4)):
                if raw:
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
            frames[0] = bytes(raw if rng.random() < 0.8 else raw[: rng.randrange(len(raw) + 1)])
        return frames

    def _mutate_field(self, head: dict, rng: random.Random) -> None:
        # The version and the operation are mutated rarely: most cases should reach the
        # checks behind them.
        rare = ("arrays", "v", "op") if rng.random() < 0.9 else ("arrays",)
        keys = [k for k in head if k not in rare]
        r = rng.random()
        if r < 0.2 and keys:
            head.pop(rng.choice(keys))
        elif r < 0.3:
            head[rng.choice(("zzz", "noreply", "timeout", "priority", "table", "n", "v"))] = (
                rng.choice(WEIRD)
            )
        elif r < 0.33:
            head["op"] = rng.choice((*KINDS, "nope", "_table", "__init__", "table_stats"))
        elif r < 0.4 and "tables" in head:  # a writer's tables naming one table twice
            head["tables"] = rng.choice((["seq", "seq"], ["trans", "seq", "trans"]))
        elif keys:
            head[rng.choice(keys)] = rng.choice(WEIRD)

    def _mutate_entry(self, head: dict, frames: list, rng: random.Random) -> None:
        meta = head["arrays"]
        i = rng.randrange(len(meta))
        entry = list(meta[i])
        r = rng.random()
        if r < 0.1:
            del meta[i]
            return
        if r < 0.2:
            meta.append(list(entry))  # a duplicate name
            return
        if r < 0.3:
            entry[0] = rng.choice(("data/obs", "data/nope", "keys", "item_anchor", 5, None, ""))
        elif r < 0.5:
            entry[1] = rng.choice(DTYPES + BAD_DTYPES + (None, 3, []))
        elif r < 0.75:
            entry[2] = rng.choice(SHAPES)
        elif r < 0.85 and len(entry) == 5:
            entry[3] = rng.choice((0, 1, 2, 5, -1, 2**40, "1", None))
        elif len(entry) == 5:
            entry[4] = rng.choice((0, 4, 7, 8, -8, 2**40, 2**63 - 1, 1.0, None))
        else:
            entry = entry[: rng.randrange(len(entry))]
        meta[i] = entry
        if rng.random() < 0.2 and len(frames) > 1:  # the frame cut short
            j = rng.randrange(1, len(frames))
            frames[j] = bytes(frames[j])[: rng.randrange(len(bytes(frames[j])) + 1)]

    def _mutate_values(self, head: dict, frames: list, rng: random.Random) -> None:
        """Keep every entry well-formed but give an array out-of-range contents."""
        meta = head["arrays"]
        try:
            _, dtype, shape, index, offset = meta[rng.randrange(len(meta))]
            count = math.prod(shape)
            dt = np.dtype(dtype)
            np.frombuffer(bytes(frames[index]), dt, count, offset)
        except Exception:  # an entry an earlier mutation broke
            return
        if count == 0 or dt.kind not in "iuf":
            return
        if dt.kind == "f":
            values = [math.nan, -1.0, math.inf, -math.inf, 0.0, 1e300]
        else:
            values = [v for v in ANCHORS if np.can_cast(np.min_scalar_type(v), dt)] or [0]
        arr = np.frombuffer(bytes(frames[index]), dt, count, offset).copy()
        with np.errstate(all="ignore"):
            arr[rng.randrange(count)] = rng.choice(values)
            if rng.random() < 0.3:
                arr[:] = rng.choice(values)
        buf = bytearray(bytes(frames[index]))
        buf[offset : offset + arr.nbytes] = arr.tobytes()
        frames[index] = bytes(buf)

    # --------------------------------------------------------------- running
    def send(self, frames: list) -> int:
        self.rid += 1
        try:
            head = msgpack.unpackb(frames[0], raw=False)
            if isinstance(head, dict):  # give the case an id of its own
                head["id"] = self.rid
                frames = [msgpack.packb(head, use_bin_type=True), *frames[1:]]
        except Exception:  # a corrupted header goes out as it is
            pass
        self.sock.send_multipart(frames)
        return self.rid

    def run_case(self, kind: str, rng: random.Random) -> None:
        """One mutated request of ``kind``; records its outcome and every failed check."""
        self.cases[kind] += 1
        header, arrays = self.base(kind, rng)
        try:
            frames = self.mutate(header, arrays, rng)
        except (ValueError, TypeError, OverflowError):
            frames = codec.encode(header, arrays)
        before = self.snapshot()
        try:
            rid = self.send(frames)
        except Exception:
            rid = None
        ping = self.rid = self.rid + 1
        self.sock.send_multipart(codec.encode({"op": "ping", "id": ping}))
        replies = self._collect(ping)
        label = f"{kind}: {describe_frames(frames)}"
        reply = replies.get(rid, replies.get(None))  # unreadable requests get id nil
        if ping not in replies:
            self.no_reply.append(label)
            self.replies["no reply"] += 1
            return
        if reply is None:
            self.replies["no reply (noreply or parked)"] += 1
            if self.server._parked:
                self.no_reply.append("parked " + label)
            changed = self.snapshot() != before
        elif reply.get("ok"):
            self.replies["ok"] += 1
            changed = True
        else:
            code = reply.get("code")
            name = codec.ERROR_CODES.get(code, type(None)).__name__
            self.replies[name] += 1
            if code == codec.INTERNAL_ERROR:
                self.internal.append(f"{label} -> {reply.get('message')}")
            timed_out = code in (5, 6)
            changed = False
            if not timed_out and self.snapshot() != before:
                self.not_intact.append(f"{label} -> {name}: {reply.get('message')}")
                changed = True
        if changed:
            self.refill()

    def _collect(self, ping: int) -> dict:
        replies: dict = {}
        deadline = time.monotonic() + self.reply_wait_s
        while ping not in replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                break
            header, _ = codec.decode(self.sock.recv_multipart())
            replies[header.get("id")] = header
        return replies

    def still_serving(self) -> bool:
        """A valid insert and sample through the server after all the cases."""
        rows = step_arrays(0, 2)
        rid = self.send(
            codec.encode(
                {"op": "insert", "table": "rows", "timeout": 5.0},
                {"data/" + k: v for k, v in rows.items()},
            )
        )
        got = self._collect(rid)
        return bool(got.get(rid, {}).get("ok")) and self.server._thread.is_alive()

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
        self.server.stop()
        for t in self.tables.values():
            t.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def item_state(table: Table) -> list[np.ndarray]:
    """The table's per-item arrays (which slots hold items, and each one's priority,
    generation and times sampled), read under its lock by the caller."""
    return [table.index.live, table.index.slot_state]


def describe_frames(frames: list) -> str:
    try:
        head = msgpack.unpackb(frames[0], raw=False)
    except Exception:
        return f"undecodable header {bytes(frames[0])[:40]!r}"
    text = repr(head)
    return text if len(text) < 300 else text[:297] + "..."


def run(cases: int, seed: int) -> dict:
    """``cases`` mutated requests (kinds drawn evenly) with mutations seeded by ``seed``."""
    logging.getLogger("rlreplay.net").setLevel(logging.CRITICAL)  # counted, not printed
    rng = random.Random(seed)
    start = time.perf_counter()
    with Harness() as h:
        for _ in range(cases):
            h.run_case(rng.choice(KINDS), rng)
        serving = h.still_serving()
        elapsed = time.perf_counter() - start
        return {
            "cases": cases,
            "seed": seed,
            "seconds": elapsed,
            "cases_by_kind": dict(sorted(h.cases.items())),
            "replies_by_kind": dict(sorted(h.replies.items())),
            "internal_errors": len(h.internal),
            "internal_error_examples": h.internal[:20],
            "tables_not_intact": len(h.not_intact),
            "not_intact_examples": h.not_intact[:20],
            "no_reply": len(h.no_reply),
            "no_reply_examples": h.no_reply[:20],
            "crashes": 0 if serving else 1,
            "still_serving": serving,
        }


RESULTS = Path(__file__).resolve().parent / "results" / "stress_wire.json"


def main(argv: list[str] | None = None) -> dict:
    """Run the stress from the command line; prints the figures, writes them as JSON and
    returns them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000, help="mutated requests to send")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mutations")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    result = run(args.cases, args.seed)
    print(f"{args.cases} cases in {result['seconds']:.1f}s (seed {args.seed})")
    print(f"{'request kind':<20s} {'cases':>8s}")
    for kind, n in result["cases_by_kind"].items():
        print(f"{kind:<20s} {n:8d}")
    print(f"{'reply':<30s} {'count':>8s}")
    for kind, n in result["replies_by_kind"].items():
        print(f"{kind:<30s} {n:8d}")
    for key in ("internal_errors", "tables_not_intact", "no_reply", "crashes"):
        print(f"{key:<30s} {result[key]:8d}")
    print(f"{'tables intact':<30s} {result['tables_not_intact'] == 0!s:>8s}")
    for key in ("internal_error_examples", "not_intact_examples", "no_reply_examples"):
        for line in result[key][:5]:
            print(f"  {key}: {line[:400]}")
    result["machine"] = platform.platform()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
