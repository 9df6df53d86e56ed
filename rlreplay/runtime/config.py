"""What a run is: the replay table it meets through and the knobs of its loops.

:class:`ReplaySpec` describes the table; :class:`RuntimeConfig` holds the loop's knobs in
the algorithm's words. :func:`build_table` turns the two into one :class:`~rlreplay.Table`
whose rate limiter holds the ratio: the loops themselves never count.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import SampleToInsertRatio
from rlreplay.core.selectors import Fifo, Selector, Uniform
from rlreplay.core.specs import Signature
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, check_count, describe

BACKENDS = ("inline", "threads", "processes", "ray")
POLICY_VERSION = "policy_version"
# An adder's default chunk_length: one insert may create this many items at once.
ITEMS_PER_INSERT = 64


@dataclass
class ReplaySpec:
    """The replay table actors write to and the learner samples.

    Args:
        signature: stored step signature, with an int64 ``policy_version`` (filled by actors).
        layout: item layout, e.g. ``NStepTransitionAdder.layout(signature, n=3)``.
        adder: picklable factory ``adder(writer, num_envs=N)``, e.g.
            ``functools.partial(NStepTransitionAdder, n=3, discount=0.99)``.
        max_size: most items the table holds (oldest removed first).
        sampler: how items are drawn (default :class:`~rlreplay.Uniform`).
        on_policy: a queue table (every item sampled once, in order; ratio knobs unused).
        name: the table's name (also on the server).

    Raises:
        InvalidArgumentError: for a signature without an int64 ``policy_version``, an adder
            that is not callable, or a bad ``max_size``.
    """

    signature: Any
    layout: ItemLayout | None
    adder: Callable[..., Any]
    max_size: int
    sampler: Selector | None = None
    on_policy: bool = False
    name: str = "replay"

    def __post_init__(self) -> None:
        self.signature = Signature(self.signature)
        sig = self.signature
        spec = sig[POLICY_VERSION] if POLICY_VERSION in sig else None  # noqa: SIM401 (no .get)
        if spec is None or spec.shape != () or spec.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"signature has no integer scalar {POLICY_VERSION!r} field (paths: "
                f"{list(self.signature.paths)}); add extras={{'{POLICY_VERSION}': 'int64'}} "
                "to the adder's signature so every step records the weights that chose it"
            )
        if not callable(self.adder):
            raise InvalidArgumentError(
                f"adder={describe(self.adder)} must be a callable adder(writer, num_envs=N), "
                "e.g. functools.partial(NStepTransitionAdder, n=3, discount=0.99)"
            )
        self.max_size = check_count(self.max_size, "max_size")


def _positive(name: str, value: Any, *, integer: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        what = "an int >= 1" if integer else "a number > 0"
        raise InvalidArgumentError(f"{name}={describe(value)} must be {what}")


@dataclass
class RuntimeConfig:
    """Knobs of a run, named for what they mean to the algorithm.

    Args:
        backend: ``"inline"`` (one thread, exactly reproducible when seeded), ``"threads"``,
            ``"processes"`` or ``"ray"`` (see :mod:`rlreplay.distributed.ray_backend`).
        num_actors: actors, each with its own vector env and seed.
        seed: base seed; actor ``i`` uses ``seed + 1000 * (i + 1)``.
        batch_size: items per learner batch.
        samples_per_insert: sampled items per inserted item (a
            :func:`~rlreplay.SampleToInsertRatio` limiter).
        updates_per_env_step: the same ratio as ``samples_per_insert / batch_size``; give
            exactly one of the two (off-policy runs).
        min_size_to_sample: items the table must hold before the first sample.
        error_buffer: how far ``samples - inserts * samples_per_insert`` may wander before a
            side blocks (``None``: enough that neither side can deadlock).
        weight_sync_period: env steps an actor takes (over its envs) between weight pulls.
        publish_every: learner updates between weight publications.
        max_policy_lag: ``None`` (actors never wait for weights) or ``0`` (each sync period
            waits for newer weights: on-policy training).
        stats_every_s: seconds between statistics rows.
        stats_every_steps: also a row at each multiple of this many env steps (``None``: none).
        progress: show a progress bar (tqdm when installed, else one line per row).
        out_dir: where ``metrics.csv`` (and TensorBoard events, when installed) go.
        timeout_s: the longest any component waits before the run fails naming it.
        replay_shards: replay servers the table is sharded over (``"ray"`` backend only).

    Raises:
        InvalidArgumentError: for an unknown backend, a bad number, or a ratio given both
            ways (or neither for an off-policy table).
    """

    backend: str = "threads"
    num_actors: int = 1
    seed: int = 0
    batch_size: int = 64
    samples_per_insert: float | None = None
    updates_per_env_step: float | None = None
    min_size_to_sample: int = 1_000
    error_buffer: float | None = None
    weight_sync_period: int = 100
    publish_every: int = 1
    max_policy_lag: int | None = None
    stats_every_s: float = 1.0
    stats_every_steps: int | None = None
    progress: bool = True
    out_dir: str | os.PathLike[str] | None = None
    timeout_s: float = 60.0
    replay_shards: int = 1

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InvalidArgumentError(
                f"backend={describe(self.backend)} is unknown; choose one of {BACKENDS}"
            )
        for name in ("num_actors", "batch_size", "min_size_to_sample", "weight_sync_period",
                     "publish_every", "replay_shards"):
            _positive(name, getattr(self, name), integer=True)
        if self.replay_shards > 1 and self.backend != "ray":
            raise InvalidArgumentError(
                f"replay_shards={self.replay_shards} shards the table over replay servers, "
                f"which only backend='ray' starts (backend={self.backend!r}); use 1"
            )
        for name in ("stats_every_s", "timeout_s"):
            _positive(name, getattr(self, name))
        _positive("stats_every_steps", self.stats_every_steps, integer=True, allow_none=True)
        _positive("samples_per_insert", self.samples_per_insert, allow_none=True)
        _positive("updates_per_env_step", self.updates_per_env_step, allow_none=True)
        _positive("error_buffer", self.error_buffer, allow_none=True)
        check_count(self.seed, "seed", minimum=0)
        if self.out_dir is not None:
            if not isinstance(self.out_dir, (str, os.PathLike)) or not os.fspath(self.out_dir):
                raise InvalidArgumentError(
                    f"out_dir={describe(self.out_dir)} must be a folder's path (a str or "
                    "os.PathLike), or None to write no files"
                )
            if os.path.exists(self.out_dir) and not os.path.isdir(self.out_dir):
                raise InvalidArgumentError(
                    f"out_dir={describe(self.out_dir)} is a file, not a folder; give a folder's "
                    "path (it is created if missing)"
                )
        if self.max_policy_lag is not None and (
            isinstance(self.max_policy_lag, bool) or self.max_policy_lag != 0
        ):
            raise InvalidArgumentError(
                f"max_policy_lag={describe(self.max_policy_lag)} must be None (actors never "
                "wait for weights) or 0 (each sync period waits for weights newer than the "
                "previous one used: on-policy training)"
            )
        if self.samples_per_insert is not None and self.updates_per_env_step is not None:
            raise InvalidArgumentError(
                f"samples_per_insert={self.samples_per_insert} and updates_per_env_step="
                f"{self.updates_per_env_step} both set the ratio; give one of them"
            )

    @property
    def ratio(self) -> float | None:
        """Target sampled items per inserted item (``None``: not set)."""
        if self.updates_per_env_step is not None:
            return self.updates_per_env_step * self.batch_size
        return self.samples_per_insert

    def actor_seed(self, index: int) -> int:
        """Seed of actor ``index``: its env, its policy's random generator."""
        return self.seed + 1000 * (index + 1)

    def limiter_buffer(self) -> float:
        """The limiter's ``error_buffer``: given, or large enough that no side can deadlock."""
        if self.error_buffer is not None:
            return float(self.error_buffer)
        ratio = self.ratio or 1.0
        return float(max(ratio * ITEMS_PER_INSERT, 2 * self.batch_size, 1.0))


def build_table(config: RuntimeConfig, replay: ReplaySpec) -> Table:
    """The run's table: a queue for on-policy runs, else ``replay.sampler`` with a
    :func:`~rlreplay.SampleToInsertRatio` limiter at ``config.ratio`` (InvalidArgumentError
    without a ratio)."""
    if replay.on_policy:
        if config.ratio is not None:
            raise InvalidArgumentError(
                f"samples_per_insert={config.samples_per_insert} / updates_per_env_step="
                f"{config.updates_per_env_step} set a ratio, but an on-policy queue table "
                "samples each item exactly once; leave both None"
            )
        size = max(replay.max_size, config.batch_size)
        span = replay.layout.span if replay.layout is not None else 1
        # Room for the queued items and, beside them, each actor's writer.
        capacity = max(2 * size, (size + 1) * span) + config.num_actors * (
            ITEMS_PER_INSERT + 2 * span
        )
        return Table.queue(
            replay.name, size, signature=replay.signature, layout=replay.layout,
            capacity=capacity, seed=config.seed,
        )
    ratio = config.ratio
    if ratio is None:
        raise InvalidArgumentError(
            "RuntimeConfig sets no ratio for an off-policy table; give samples_per_insert "
            "(sampled items per inserted item) or updates_per_env_step (e.g. 0.25)"
        )
    span = replay.layout.span if replay.layout is not None else 1
    # max_size items, a quarter more for rows anchoring no item, and the actors' writers.
    capacity = (
        replay.max_size + replay.max_size // 4 + span
        + config.num_actors * (2 * ITEMS_PER_INSERT + span) * 16
    )
    limiter = SampleToInsertRatio(
        ratio, min_size_to_sample=config.min_size_to_sample, error_buffer=config.limiter_buffer()
    )
    return Table(
        replay.name,
        signature=replay.signature,
        capacity=math.ceil(capacity),
        layout=replay.layout,
        sampler=replay.sampler or Uniform(),
        remover=Fifo(),
        max_size=replay.max_size,
        rate_limiter=limiter,
        seed=config.seed,
    )
