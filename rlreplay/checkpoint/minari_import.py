"""Pre-filling replay from a Minari dataset: into a table of step rows, or through an adder.

See :func:`import_minari`. The columns a table of step rows needs are those of
:mod:`rlreplay.checkpoint.episode_columns`; an adder takes the episodes as an environment
loop would give them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.checkpoint.episode_columns import DEFAULT_FIELDS, leaves, nest, resolve_fields
from rlreplay.checkpoint.minari_format import load_dataset
from rlreplay.core.keys import check_priorities
from rlreplay.core.specs import cast_problem
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import DatasetError, InvalidArgumentError, SignatureError, describe

__all__ = ["MinariImport", "import_minari"]


@dataclass(frozen=True)
class MinariImport:
    """What :func:`import_minari` inserted.

    Attributes:
        episodes: episodes read.
        steps: environment steps read.
        keys: int64 keys of the items created, one per step (direct import into a
            table); ``None`` through an adder.
        items: items created.
    """

    episodes: int
    steps: int
    keys: np.ndarray | None
    items: int


@dataclass(frozen=True)
class _EpisodeSteps:
    """A Minari dataset's episodes as step columns (all episodes, in order)."""

    obs: dict[str, np.ndarray]  # column path -> the observation each step was taken from
    next_obs: dict[str, np.ndarray]  # the same paths -> the observation it led to
    action: dict[str, np.ndarray]
    scalars: dict[str, np.ndarray]  # "reward", "terminated", "truncated"
    lengths: np.ndarray  # steps of each episode

    @property
    def episodes(self) -> int:
        return len(self.lengths)


def _read_episodes(dataset: Any, obs_prefix: str, action_prefix: str) -> _EpisodeSteps:
    """Read every episode once; each column is one concatenation."""
    parts: dict[str, dict[str, list[np.ndarray]]] = {
        k: {} for k in ("obs", "next_obs", "action", "scalars")
    }

    def put(part: str, arrays: Mapping[str, Any]) -> None:
        for path, arr in arrays.items():
            parts[part].setdefault(path, []).append(np.asarray(arr))

    lengths = []
    for ep in dataset.iterate_episodes():
        lengths.append(len(ep.rewards))
        obs = leaves(ep.observations, obs_prefix)
        put("obs", {p: a[:-1] for p, a in obs.items()})
        put("next_obs", {p: a[1:] for p, a in obs.items()})
        put("action", leaves(ep.actions, action_prefix))
        put(
            "scalars",
            {"reward": ep.rewards, "terminated": ep.terminations, "truncated": ep.truncations},
        )
    joined = {k: {p: np.concatenate(v) for p, v in d.items()} for k, d in parts.items()}
    if not lengths:
        raise DatasetError("the dataset holds no episodes; nothing to import")
    return _EpisodeSteps(**joined, lengths=np.asarray(lengths, dtype=np.int64))


def import_minari(
    dataset: Any,
    target: Any,
    *,
    root: str | os.PathLike | None = None,
    fields: Mapping[str, str] | None = None,
    priority: float | None = None,
) -> MinariImport:
    """Pre-fill replay from a Minari dataset's episodes.

    Into a :class:`Table` of step rows (an item layout of rows, one item per step, and
    the columns of :mod:`~rlreplay.checkpoint.episode_columns`): every step is appended
    with its next observation and flags, one batch. Through an adder (one environment,
    ``num_envs=None``): each episode is played into it (``reset`` with its first
    observation, ``add`` per step), so its tables get the adder's items.

    Everything that can be checked first is: the dataset's observation and action
    shapes and dtypes against the columns (a mismatch names the column, both shapes
    and dtypes), and for a table its capacity, ``max_size`` and rate limiter; nothing is
    inserted when a check fails.

    Args:
        dataset: a ``minari.MinariDataset``, a dataset id (looked up under ``root``) or
            the path of a dataset's directory.
        target: a :class:`Table` of step rows, or an adder.
        root: directory Minari keeps datasets in (default: Minari's own).
        fields: role to column name, as for :func:`export_minari` (tables only).
        priority: priority of the new items of a table (default: the table's); an
            adder gives its items its own ``priority``.

    Returns:
        :class:`MinariImport`.

    Raises:
        SignatureError: if the data do not fit the target's columns.
        DatasetError: if the table lacks episode columns or is not of rows, or the data
            do not fit its capacity, ``max_size`` or rate limiter now.
        InvalidArgumentError: for a bad ``dataset``, ``target`` or ``priority``.
    """
    from rlreplay.writers.stream import StreamAdder

    if isinstance(target, StreamAdder):
        if fields is not None or priority is not None:
            raise InvalidArgumentError(
                "fields and priority are for a table of step rows; an adder takes the "
                "dataset's observations and actions as its obs and action and gives its "
                "items its own priority: leave them out"
            )
        return _into_adder(load_dataset(dataset, root), target)
    if not isinstance(target, Table):
        raise InvalidArgumentError(
            f"target={describe(target)} must be a Table of step rows or an adder "
            "(e.g. NStepTransitionAdder(table, n=3, num_envs=None))"
        )
    table, store = target, target.store
    roles = resolve_fields(store.signature, fields, "import")
    if not table.layout.is_rows or store.lanes != 1:
        raise DatasetError(
            f"table {table.name!r} must have a layout of rows and a store of one lane to "
            "take episodes directly as step rows; fill other layouts through an adder "
            "(import_minari(dataset, adder))"
        )
    extra = [p for p in store.signature.paths if not any(p in v for v in roles.values())]
    if extra:
        raise DatasetError(
            f"table {table.name!r} has columns {extra} that a Minari dataset cannot fill; "
            "import into a table with only the episode columns, or through an adder"
        )
    names = {**DEFAULT_FIELDS, **(fields or {})}
    data = _read_episodes(load_dataset(dataset, root), names["observation"], names["action"])
    rows: dict[str, np.ndarray] = {}
    for role in ("reward", "terminated", "truncated"):
        rows[roles[role][0]] = data.scalars[role]
    for o, x in zip(roles["observation"], roles["next_observation"]):
        rows[o] = _column(data.obs, o, o, store, table.name)
        rows[x] = _column(data.next_obs, o, x, store, table.name)
    for p in roles["action"]:
        rows[p] = _column(data.action, p, p, store, table.name)
    for role in ("reward", "terminated", "truncated"):
        _check_cast(rows[roles[role][0]], roles[role][0], store, table.name)
    n = len(data.scalars["reward"])
    prios = None if priority is None else check_priorities(priority, n, "priority")
    _check_room(table, n)
    with store.mutex:
        _check_room(table, n)  # again, with the lock held until the items exist
        first = store.append(rows)
        keys = table.create_items(np.arange(first, first + n), prios)
    return MinariImport(data.episodes, n, keys, len(keys))


def _column(
    arrays: dict[str, np.ndarray], key: str, column: str, store: StepStore, table: str
) -> np.ndarray:
    """The dataset's ``arrays[key]`` for ``column``, checked against the store."""
    if key not in arrays:
        raise SignatureError(
            f"the dataset has no data for column {column!r} of table {table!r} (it has "
            f"{sorted(arrays)}); build the table with the dataset's observation and action "
            "structure"
        )
    _check_cast(arrays[key], column, store, table)
    return arrays[key]


def _check_cast(arr: np.ndarray, column: str, store: StepStore, table: str) -> None:
    spec = store.signature[column]
    problem = cast_problem(arr, spec.dtype)
    if arr.shape[1:] != spec.shape or problem:
        raise SignatureError(
            f"the dataset's data for column {column!r} of table {table!r} have shape "
            f"{arr.shape[1:]}, {arr.dtype} per step; the column is shape {spec.shape}, "
            f"{spec.dtype}{'' if not problem else f' (the data {problem})'}; build the "
            f"table with a {column!r} column of shape {arr.shape[1:]} and dtype {arr.dtype}"
        )


def _check_room(table: Table, n: int) -> None:
    store = table.store
    if n > store.capacity or n > table.max_size:
        raise DatasetError(
            f"the dataset holds {n} steps; table {table.name!r} keeps at most "
            f"{min(store.capacity, table.max_size)} (capacity={store.capacity}, "
            f"max_size={table.max_size}); import into a larger table, or a dataset of "
            "fewer episodes (minari.MinariDataset(path, episode_indices=...))"
        )
    with store.mutex:
        if not table.admission.can_insert(n, n):
            raise DatasetError(
                f"table {table.name!r} cannot take {n} items now: its rate limiter "
                f"({table.rate_limiter!r}) or a queue's items on the rows to be overwritten "
                "would make the import wait (or the table is closed); import into a table "
                "that admits them (e.g. MinSize), then sample"
            )


def _into_adder(dataset: Any, adder: Any) -> MinariImport:
    """Play every episode into ``adder`` (one environment), checked first."""
    from rlreplay.writers.adder_writer import writer_signature

    if adder.batched:
        raise InvalidArgumentError(
            "the adder takes batches of environments (num_envs given); import through an "
            "adder made with num_envs=None"
        )
    signature = writer_signature(adder.writer)
    data = _read_episodes(dataset, "obs", "action")
    stacked = bool(getattr(adder, "stacked_obs", False))
    for column, arr in {**data.obs, **data.action}.items():
        if column not in signature:
            raise SignatureError(
                f"the dataset has data for column {column!r}, which the adder's store "
                f"lacks (its columns: {list(signature.paths)}); build the adder's table "
                "with the dataset's observation and action structure"
            )
        spec = signature[column]
        problem = cast_problem(arr, spec.dtype)
        if (arr.shape[1:] != spec.shape and not (stacked and column in data.obs)) or problem:
            raise SignatureError(
                f"the dataset's data for column {column!r} have shape {arr.shape[1:]}, "
                f"{arr.dtype} per step; the adder's column is shape {spec.shape}, "
                f"{spec.dtype}{'' if not problem else f' (the data {problem})'}; build "
                "the adder's table with the dataset's shapes and dtypes"
            )
    obs, next_obs = _steps(data.obs, "obs"), _steps(data.next_obs, "obs")
    action = _steps(data.action, "action")
    reward, terminated, truncated = (data.scalars[k] for k in ("reward", "terminated", "truncated"))
    before = adder.items_created
    starts = np.cumsum(data.lengths) - data.lengths
    for start, length in zip(starts.tolist(), data.lengths.tolist()):
        adder.reset(obs(start))
        for t in range(start, start + length):
            adder.add(action(t), reward[t], next_obs(t), bool(terminated[t]), bool(truncated[t]))
    adder.flush()
    return MinariImport(data.episodes, len(reward), None, adder.items_created - before)


def _steps(arrays: dict[str, np.ndarray], prefix: str) -> Any:
    """A function of ``t`` giving step ``t`` of a role's columns: one array's row, or the
    nested dict of rows."""
    paths = sorted(arrays)
    if paths == [prefix]:
        return arrays[prefix].__getitem__
    return lambda t: nest(prefix, paths, {p: arrays[p][t] for p in paths})
