"""Minari datasets (``pip install "rlreplay[minari]"``): whole episodes out of and into replay."""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.specs import cast_problem
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.datasets.episodes import (
    DEFAULT_FIELDS,
    episodes_from_items,
    episodes_from_rows,
    infer_space,
    is_episode_table,
    leaves,
    nest,
    resolve_fields,
)
from rlreplay.datasets.table_contents import step_range
from rlreplay.errors import DatasetError, InvalidArgumentError, SignatureError, describe

_ROOT_LOCK = threading.Lock()


@contextmanager
def _datasets_root(root: str | os.PathLike | None) -> Iterator[None]:
    """Point Minari at an absolute ``root`` (via ``MINARI_DATASETS_PATH``); one call at a time.
    Absolute: Minari joins a relative root twice and then cannot find what it wrote."""
    if root is None:
        yield
        return
    with _ROOT_LOCK:
        old = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = os.path.abspath(os.fspath(root))
        try:
            yield
        finally:
            if old is None:
                del os.environ["MINARI_DATASETS_PATH"]
            else:
                os.environ["MINARI_DATASETS_PATH"] = old


def _minari() -> Any:
    try:
        import minari
    except ImportError as exc:
        raise ImportError('Minari datasets need minari: pip install "rlreplay[minari]"') from exc
    return minari


def _source_store(source: Any) -> StepStore:
    if isinstance(source, Table):
        return source.store
    if isinstance(source, StepStore):
        return source
    raise InvalidArgumentError(
        f"source={describe(source)} must be a Table or a StepStore whose step rows hold episodes"
    )


def export_minari(
    source: Table | StepStore,
    dataset_id: str,
    *,
    root: str | os.PathLike | None = None,
    fields: Mapping[str, str] | None = None,
    observation_space: Any = None,
    action_space: Any = None,
    first_id: int | None = None,
    end_id: int | None = None,
    **metadata: Any,
) -> Any:
    """Write the whole episodes held in replay as a Minari dataset.

    Each lane of a store is one stream of episodes; rows of an unfinished or partly
    overwritten episode are left out. From an :class:`~rlreplay.writers.EpisodeAdder` table,
    each item is one episode. See :mod:`rlreplay.datasets.episodes` for what is required.

    Args:
        source: a :class:`StepStore` or a :class:`Table` (an EpisodeAdder table's items,
            else its store's step rows).
        dataset_id: Minari's dataset id, e.g. ``"cartpole/random-v0"``; it must not exist.
        root: directory Minari keeps datasets in (default: Minari's own).
        fields: role to column name, for columns not named as in
            :data:`~rlreplay.datasets.episodes.DEFAULT_FIELDS`.
        observation_space: a gymnasium space; default the ``env``'s (in ``metadata``), else
            inferred (:func:`~rlreplay.datasets.episodes.infer_space`).
        action_space: a gymnasium space, found as ``observation_space`` is; an inferred
            ``Discrete`` takes the data's largest action: give it when some may never appear.
        first_id: the first step id (insert count) to read.
        end_id: the step id the range read ends before.
        **metadata: passed to ``minari.create_dataset_from_buffers`` (``env``,
            ``algorithm_name``, ``author``, ``description``, ...).

    Returns:
        The ``minari.MinariDataset`` written.

    Raises:
        DatasetError: if episode columns are missing, rows do not continue each other, items
            may split episodes, no whole episode is in the range, or the dataset exists.
        InvalidArgumentError: for a bad ``source``, ``dataset_id``, ``fields`` or range.
    """
    minari = _minari()
    store = _source_store(source)
    from_items = isinstance(source, Table) and is_episode_table(source)
    if from_items and fields is not None:
        raise InvalidArgumentError(
            f"fields={describe(fields)} names step-row columns; table {source.name!r} is an "
            "EpisodeAdder table, whose columns are the adder's (obs, action, reward, "
            "discount): leave fields out"
        )
    if not from_items:
        roles = resolve_fields(store.signature, fields, "export")
    _check_new(minari, dataset_id, root)
    step_range(store, first_id, end_id)
    if from_items:
        span, episodes = episodes_from_items(source, first_id, end_id)
    else:
        names = {**DEFAULT_FIELDS, **(fields or {})}
        span, episodes = episodes_from_rows(store, roles, names, first_id, end_id)
    if not episodes:
        raise DatasetError(
            f"steps [{span.first_id}, {span.end_id}) hold no whole episode (none ends with "
            "terminated or truncated set after a known start); nothing was written"
        )
    env_given = metadata.get("env") is not None  # Minari then takes the env's spaces
    if observation_space is None and not env_given:
        observation_space = infer_space(_joined([e.observations for e in episodes]))
    if action_space is None and not env_given:
        action_space = infer_space(_joined([e.actions for e in episodes]))
    kwargs = dict(metadata)
    params = inspect.signature(minari.create_dataset_from_buffers).parameters
    if "jpeg_encoding" in params:
        kwargs.setdefault("jpeg_encoding", False)  # lossless, as stored
    if "data_format" in params:
        kwargs.setdefault("data_format", "hdf5")
    from minari.data_collector import EpisodeBuffer

    buffers = [
        EpisodeBuffer(
            id=number,
            observations=e.observations,
            actions=e.actions,
            rewards=e.rewards,
            terminations=e.terminations,
            truncations=e.truncations,
            infos={},  # Minari's reader expects a dict
        )
        for number, e in enumerate(episodes)
    ]
    with _datasets_root(root):
        return minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            observation_space=observation_space,
            action_space=action_space,
            **kwargs,
        )


def _check_new(minari: Any, dataset_id: Any, root: str | os.PathLike | None) -> None:
    """Refuse a dataset id that exists already, before anything is read."""
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        well_formed = isinstance(dataset_id, str) and bool(parse_dataset_id(dataset_id))
    except (TypeError, ValueError):  # Minari's own check of the id's form
        well_formed = False
    if not well_formed:
        raise InvalidArgumentError(
            f"dataset_id={describe(dataset_id)} must be a Minari dataset id of the form "
            "'(namespace/)name-v<version>', such as 'cartpole/random-v0'"
        )
    with _datasets_root(root):
        if get_dataset_path(dataset_id).exists():
            raise DatasetError(
                f"a Minari dataset {dataset_id!r} exists already under "
                f"{get_dataset_path()}; choose another id or version (e.g. '-v1'), or "
                "delete it first (minari.delete_dataset)"
            )


def _joined(values: list[Any]) -> Any:
    """Episodes' observations (or actions) joined along steps, nested dicts kept."""
    if isinstance(values[0], Mapping):
        return {k: _joined([v[k] for v in values]) for k in values[0]}
    return np.concatenate(values)


def load_dataset(dataset: Any, root: str | os.PathLike | None = None) -> Any:
    """``dataset`` as a ``minari.MinariDataset``: one already, an id under ``root``, or a path.

    Raises:
        InvalidArgumentError: for anything else.
        DatasetError: for an id not found under the root.
    """
    minari = _minari()
    if isinstance(dataset, minari.MinariDataset):
        return dataset
    if isinstance(dataset, (str, os.PathLike)):
        path = Path(dataset)
        if not isinstance(dataset, str) or path.is_absolute() or path.exists():
            data = path / "data" if (path / "data").is_dir() else path
            return minari.MinariDataset(data)
        with _datasets_root(root):
            try:
                return minari.load_dataset(dataset)
            except FileNotFoundError as exc:
                where = os.environ.get("MINARI_DATASETS_PATH", "Minari's default root")
                raise DatasetError(
                    f"dataset={describe(dataset)} is not a Minari dataset id found under "
                    f"{where}; download it first (`minari download {dataset}`), "
                    "give the root it lies under (root=...), or the path of its directory"
                ) from exc
    raise InvalidArgumentError(
        f"dataset={describe(dataset)} must be a minari.MinariDataset, a dataset id or the "
        "path of a dataset's directory"
    )


@dataclass(frozen=True)
class MinariImport:
    """What :func:`import_minari` inserted.

    Attributes:
        episodes: episodes read.
        steps: environment steps read.
        keys: int64 keys of the items created, one per step (``None`` through an adder).
        items: items created.
    """

    episodes: int
    steps: int
    keys: np.ndarray | None
    items: int


@dataclass(frozen=True)
class _EpisodeSteps:
    """A Minari dataset's episodes as step columns (all episodes, in order)."""

    obs: dict[str, np.ndarray]
    next_obs: dict[str, np.ndarray]
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

    Into a :class:`Table` of step rows, one item per step; through an adder
    (``num_envs=None``), as an environment loop would. Into a table, everything is checked first
    and a failed import inserts nothing; through an adder only shapes and dtypes are, then each
    call waits or raises as the adder's (episodes already played stay).

    Args:
        dataset: a ``minari.MinariDataset``, a dataset id (under ``root``) or a directory.
        target: a :class:`Table` of step rows, or an adder.
        root: directory Minari keeps datasets in (default: Minari's own).
        fields: role to column name, as for :func:`export_minari` (tables only).
        priority: priority of a table's new items (default: the table's).

    Returns:
        :class:`MinariImport`.

    Raises:
        SignatureError: if the data do not fit the target's columns.
        DatasetError: if the table lacks episode columns or is not of rows, or the data do
            not fit its capacity, ``max_size`` or rate limiter now.
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
    table.index.check_priority_range(prios, "priority")
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
    from rlreplay.writers.adder_options import writer_signature

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
    """A function of ``t`` giving step ``t`` of a role's columns."""
    paths = sorted(arrays)
    if paths == [prefix]:
        return arrays[prefix].__getitem__
    return lambda t: nest(prefix, paths, {p: arrays[p][t] for p in paths})
