"""Raw ``write`` requests, as a remote writer sends them, and what a chunk may change."""

from __future__ import annotations

import numpy as np

CHUNK_SIG = {"obs": ((2,), "float32"), "reward": "float32"}
STORE_STEPS = 16


def chunk_steps(first: int, n: int) -> dict[str, np.ndarray]:
    k = np.arange(first, first + n, dtype=np.float32)
    return {"obs": np.stack([k, -k], 1), "reward": k}


def state(tables: dict) -> list:
    """Everything a chunk changes: each table's size and inserts, and the stored steps."""
    out = []
    for t in tables.values():
        info = t.info()
        out.append((info.size, info.inserts, info.evictions, info.overwrite_evictions))
    store = next(iter(tables.values())).store
    out.append((store.next_id, *(c.tobytes() for c in store.columns.values())))
    return out


def write(client, header: dict, arrays: dict):
    """One raw ``write`` request (as a remote writer sends it); returns the reply arrays."""
    base = {
        "op": "write",
        "writer": 12345,  # an int, as older clients send (16 bytes now)
        "tables": ["seq", "rows"],
        "history": 4,
        "seq": 0,
        "first": 0,
        "n": 4,
        "episode_starts": [0],
        "timeout": 2.0,
    }
    base.update(header)
    n = base["n"] if isinstance(base["n"], int) else 4
    data = {"data/" + k: v for k, v in chunk_steps(100, n).items()}
    return client.transport.wait(client.transport.send(base, {**data, **arrays}), 10.0)[1]


def items(table_idx, anchors, priorities=None, lengths=None) -> dict:
    out = {
        "item_table": np.asarray(table_idx, np.int32),
        "item_anchor": np.asarray(anchors, np.int64),
        "item_priority": np.asarray(
            np.full(len(anchors), np.nan) if priorities is None else priorities, np.float64
        ),
    }
    if lengths is not None:
        out["item_length"] = np.asarray(lengths, np.int64)
    return out
