"""The runtime's parts, as the interfaces they meet through.

:class:`ReplayTable`, :class:`Adder` over a :class:`Writer`, :class:`WeightsSource` /
:class:`WeightsPublisher`, the user's :class:`Policy` and :class:`LearnerLogic`,
:class:`ActorGroup`, and the :class:`Backend` that runs them to a :class:`RunResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from rlreplay.core.sample import Sample
    from rlreplay.core.specs import Signature
    from rlreplay.core.table_info import TableInfo
    from rlreplay.runtime.config import ReplaySpec, RuntimeConfig
    from rlreplay.runtime.weights import WeightsSnapshot

OnStats = Callable[[dict, Any], "dict | None"]
"""The user's hook: called with each statistics row and the newest weights, it returns
more columns for the row (or ``None``)."""


class ReplayTable(Protocol):
    """What the learner (and the driver's statistics) use of a table, wherever it is."""

    name: str

    def sample(self, num_samples: int, *, timeout: float | None = None) -> Sample:
        """A batch of ``num_samples`` items, waiting at most ``timeout`` for the limiter."""

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> Any:
        """New priorities for sampled keys."""

    def can_sample(self, num_samples: int) -> bool:
        """Whether the rate limiter allows a sample of ``num_samples`` now."""

    def info(self) -> TableInfo:
        """Size and counters (inserts, samples)."""


class Writer(Protocol):
    """One stream of steps into tables sharing a step store, and the items over them; a call
    that raises a timeout error took nothing of its input, one that returns took all."""

    @property
    def signature(self) -> Signature:
        """The store's step signature: what each appended step holds."""

    @property
    def history(self) -> int:
        """Steps an item may reach back from the latest one."""

    @property
    def tables(self) -> list[Any]:
        """The tables items go to: :class:`~rlreplay.Table` s, or handles with the served tables'
        ``name`` and ``layout``."""

    def append_batch(self, steps: Any, *, timeout: float | None = None) -> Any:
        """Append consecutive steps of the current episode (one array per field)."""

    def create_items(
        self, table: Any, priorities: Any = None, *, starts: Any, lengths: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """One item per entry of ``starts`` (negative indexes into this episode's steps)."""

    def end_episode(self) -> None:
        """Later items cannot reach the steps before this call. Calling it twice in a row is
        calling it once (adders call it again when they retry a chunk whose append timed out)."""

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything appended is stored."""

    def close(self) -> None:
        """Release the retained steps; later calls raise a closed error."""

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        """:meth:`close`; after an exception, without waiting to store what it holds."""


class Adder(Protocol):
    """Turns an actor's vector steps into items (:mod:`rlreplay.writers`)."""

    def reset(self, obs: Any) -> None:
        """Start every env's episode at ``obs``."""

    def add(
        self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
        info: Any, *, extras: dict[str, np.ndarray] | None = None,
    ) -> None:
        """One vector step; raises a timeout error (keeping the step) when the table refuses."""

    def hand_over(self) -> None:
        """Retry what :meth:`add` could not hand over, waiting only for room; may time out again."""

    def flush(self) -> None:
        """Hand over every completed item now."""

    def close(self) -> None:
        """End open episodes (as truncated) and hand everything over."""


class WeightsSource(Protocol):
    """Where actors get versioned weights."""

    def latest(self) -> WeightsSnapshot | None:
        """The newest published weights, or ``None`` before the first publication."""

    def wait_for(self, min_version: int, timeout: float) -> WeightsSnapshot:
        """Weights of version ``min_version`` or newer, waiting at most ``timeout``."""


class WeightsPublisher(WeightsSource, Protocol):
    """Where the learner publishes its weights, one version after another."""

    def publish(self, params: dict[str, np.ndarray]) -> WeightsSnapshot:
        """Publish ``params`` as the next version."""

    def close(self) -> None:
        """Wake waiting readers with a closed error; no more publications."""


class Policy(Protocol):
    """What an actor acts with; built in the actor by ``make_policy(index, num_actors, seed)``."""

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """Load newly published weights."""

    def __call__(self, obs: np.ndarray, env_steps: int) -> Any:
        """Actions for a batch of observations, or ``(actions, extras)`` of per-env extra fields;
        ``env_steps`` is the actor's env steps so far."""


class LearnerLogic(Protocol):
    """What the user's learner provides."""

    def update(self, batch: Sample) -> np.ndarray | None:
        """One update on ``batch``; returns new priorities for ``batch.info.keys`` or None."""

    def params(self) -> dict[str, np.ndarray]:
        """Numpy copies of the weights the actors should act with."""


class ActorGroup(Protocol):
    """The actors of a concurrent backend, wherever they run."""

    def start(self) -> None:
        """Start every actor."""

    def counters(self) -> np.ndarray:
        """``[num_actors, NUM_COUNTERS]``, each row written only by its actor."""

    def done(self) -> bool:
        """Every actor reached its quota and handed its last step over."""

    def check(self) -> None:
        """Raise :class:`~rlreplay.errors.ComponentFailedError` for an actor that raised or died."""

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every actor; nothing is left running when it returns."""


@dataclass
class RunResult:
    """What :func:`~rlreplay.runtime.run` returns: statistics ``rows``, ``summary``, ``table``."""

    rows: list[dict]
    summary: dict
    table: Any


class ActorFactory(Protocol):
    """What a backend builds actors from (:class:`~rlreplay.runtime.environment_loop.
    ActorRecipe`): the config, each actor's quota of env steps, and the build."""

    config: RuntimeConfig
    quota: int

    def build(
        self, index: int, writer: Writer, weights: WeightsSource, counters: np.ndarray,
        stop: Any,
        waits_for_room: bool = True,
    ) -> Any:
        """The environment loop of actor ``index``, writing through ``writer``."""


class Backend(Protocol):
    """Places the parts (table, weights, actors, learner) and runs them to the end."""

    def run(
        self,
        config: RuntimeConfig,
        recipe: ActorFactory,
        replay: ReplaySpec,
        logic: LearnerLogic,
        total_env_steps: int,
        on_stats: OnStats | None,
        max_updates: int | None,
    ) -> RunResult:
        """Train until the actors took ``total_env_steps`` and the learner drained what the limiter
        allows (or ``max_updates``); raise :class:`~rlreplay.errors.ComponentFailedError` when a
        part fails."""
