"""`rlreplay demo`: an actor and a learner meeting only through one table.

The actor thread steps a small synthetic environment and inserts transitions; the
learner thread samples batches and takes a (numpy) gradient-like step on each. Neither
loop knows about the other: the table's ``SampleToInsertRatio`` rate limiter alone keeps
``samples / inserts`` at the chosen ratio, blocking whichever side runs ahead. Every second
the demo prints inserts/s, samples/s, the ratio held so far and the time each side spent
blocked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import SampleToInsertRatio
from rlreplay.core.selectors import Prioritized
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError, RateLimiterTimeoutError, describe
from rlreplay.writers import TrajectoryWriter

OBS_DIM, ACT_DIM = 17, 6


def build_table(samples_per_insert: float, batch_size: int, capacity: int) -> Table:
    """A prioritized transition table whose next_obs reads the stored obs column."""
    store = StepStore(
        {"obs": ((OBS_DIM,), "float32"), "action": ((ACT_DIM,), "float32"), "reward": "float32"},
        capacity=capacity,
    )
    min_size = 4 * batch_size
    return Table(
        "replay",
        store=store,
        layout=ItemLayout.transition(store.signature),
        sampler=Prioritized(priority_exponent=0.6),
        rate_limiter=SampleToInsertRatio(
            samples_per_insert, min_size_to_sample=min_size, error_buffer=4 * batch_size
        ),
        seed=0,
    )


def actor(table: Table, stop: threading.Event, seed: int = 0) -> None:
    """Steps a random linear system and writes transitions, episodes of 200 steps."""
    rng = np.random.default_rng(seed)
    dynamics = rng.normal(scale=0.3, size=(OBS_DIM, OBS_DIM)).astype(np.float32)
    with TrajectoryWriter(table) as writer:
        obs = rng.normal(size=OBS_DIM).astype(np.float32)
        t = 0
        while not stop.is_set():
            action = rng.uniform(-1, 1, size=ACT_DIM).astype(np.float32)
            reward = float(-np.square(obs).mean())
            writer.append({"obs": obs, "action": action, "reward": reward})
            if t > 0:
                try:
                    writer.create_item(table, timeout=0.2)
                except RateLimiterTimeoutError:
                    continue  # learner is behind; check stop and retry next step
                except ClosedError:
                    return
            obs = np.tanh(dynamics @ obs).astype(np.float32)
            t += 1
            if t == 200:
                writer.end_episode()
                obs, t = rng.normal(size=OBS_DIM).astype(np.float32), 0


def learner(table: Table, stop: threading.Event, batch_size: int, steps: list[int]) -> None:
    """Samples batches, fits a linear model to predict next_obs, sends priorities back."""
    weights = np.zeros((OBS_DIM, OBS_DIM), dtype=np.float32)
    while not stop.is_set():
        try:
            batch = table.sample(batch_size, timeout=0.2)
        except RateLimiterTimeoutError:
            continue
        except ClosedError:
            return
        obs, target = batch.data["obs"], batch.data["next_obs"]
        error = obs @ weights - target
        iw = batch.importance_weights(beta=0.4)[:, None]
        weights -= 0.01 * obs.T @ (iw * error) / batch_size
        table.update_priorities(batch.info.keys, np.abs(error).mean(axis=1) + 1e-6)
        steps[0] += 1


def run_demo(
    seconds: float = 10.0,
    samples_per_insert: float = 8.0,
    batch_size: int = 64,
    capacity: int = 100_000,
    print_fn: Callable[[str], None] = print,
) -> dict:
    """Run the actor and learner for ``seconds`` and return the final table info.

    Raises:
        InvalidArgumentError: for a non-positive ``seconds``, ``samples_per_insert``,
            ``batch_size`` or ``capacity``, or a ``capacity`` below the ``4 * batch_size``
            items the learner waits for.
    """
    for name, value in (("seconds", seconds), ("samples_per_insert", samples_per_insert)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise InvalidArgumentError(f"{name}={describe(value)} must be a number above 0")
    for name, value in (("batch_size", batch_size), ("capacity", capacity)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidArgumentError(f"{name}={describe(value)} must be an int above 0")
    if capacity <= 4 * batch_size:
        raise InvalidArgumentError(
            f"capacity={capacity} must exceed 4 * batch_size={4 * batch_size}: the learner "
            "waits for that many items before it samples"
        )
    table = build_table(samples_per_insert, batch_size, capacity)
    stop = threading.Event()
    steps = [0]
    threads = [
        threading.Thread(target=actor, args=(table, stop), daemon=True),
        threading.Thread(target=learner, args=(table, stop, batch_size, steps), daemon=True),
    ]
    for th in threads:
        th.start()
    print_fn(
        f"actor -> table (SampleToInsertRatio samples_per_insert={samples_per_insert}, "
        f"batch {batch_size}) -> learner, for {seconds:g}s"
    )
    print_fn(
        f"{'t':>4} {'inserts/s':>10} {'samples/s':>10} {'ratio':>7} "
        f"{'actor blocked':>14} {'learner blocked':>16} {'size':>8}"
    )
    last = table.info()
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds:
            time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - start))))
            now = table.info()
            ratio = now.samples / max(1, now.inserts)
            print_fn(
                f"{time.monotonic() - start:4.0f} {now.inserts - last.inserts:>10} "
                f"{now.samples - last.samples:>10} {ratio:7.2f} "
                f"{now.insert_blocked_s:13.1f}s {now.sample_blocked_s:15.1f}s {now.size:>8}"
            )
            last = now
    finally:
        stop.set()
        table.close()
        for th in threads:
            th.join(timeout=5)
    info = table.info()
    print_fn(
        f"done: {info.inserts} inserts, {info.samples} samples, {steps[0]} learner steps, "
        f"ratio {info.samples / max(1, info.inserts):.2f} (target {samples_per_insert:g})"
    )
    return info.to_dict()
