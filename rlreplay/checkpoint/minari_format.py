"""Minari datasets out of replay: the gymnasium ecosystem's offline-RL format.

:func:`export_minari` writes the whole episodes held in a store's step rows (see
:mod:`rlreplay.checkpoint.episode_columns` for the columns required) or in an
``EpisodeAdder`` table's items (:mod:`rlreplay.checkpoint.episodes_out`) as a Minari
dataset that ``minari.load_dataset`` reads. The way back is
:mod:`rlreplay.checkpoint.minari_import`; :func:`load_dataset` is shared by both.

Minari (``pip install "rlreplay[minari]"``, which brings h5py for its storage) is
imported when these functions are called. Minari keeps datasets under a root directory
(``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``); pass ``root=`` to use another.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.episode_columns import DEFAULT_FIELDS, infer_space, resolve_fields
from rlreplay.checkpoint.episodes_out import (
    episodes_from_items,
    episodes_from_rows,
    is_episode_table,
)
from rlreplay.checkpoint.table_contents import step_range
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import DatasetError, InvalidArgumentError, describe

__all__ = ["export_minari", "load_dataset"]

_ROOT_LOCK = threading.Lock()


@contextmanager
def _datasets_root(root: str | os.PathLike | None) -> Iterator[None]:
    """Point Minari at ``root`` for the calls inside (Minari reads the root from the
    ``MINARI_DATASETS_PATH`` environment variable only); one such call at a time. A
    relative ``root`` is made absolute first: Minari joins a relative root to a path that
    already holds it and fails to find the file it has just written."""
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

    From step rows (a :class:`StepStore`, or a table over one): each lane of the store is
    one stream of steps; an episode is its rows up to and including a row with
    ``terminated`` or ``truncated`` set, and its observations are the rows' observations
    plus the last row's next observation. Rows of an episode that had not ended are left
    out, and so are the rows before the first episode end unless the range starts at
    step 0 or right after a stored step that ended an episode (the episode's start may
    have been overwritten). Consecutive rows of an episode must continue each other
    (``next_obs`` of one is ``obs`` of the next), which is checked.

    From an :class:`~rlreplay.writers.EpisodeAdder` table: each of its items whose rows
    lie in the range is one episode (see :mod:`rlreplay.checkpoint.episodes_out` for
    what that requires).

    Args:
        source: a :class:`StepStore` or a :class:`Table` (an EpisodeAdder table's items,
            else its store's step rows).
        dataset_id: Minari's dataset id, e.g. ``"cartpole/random-v0"``; it must not exist.
        root: directory Minari keeps datasets in (default: Minari's own).
        fields: role to column name, for columns not named as in
            :data:`~rlreplay.checkpoint.episode_columns.DEFAULT_FIELDS`.
        observation_space: a gymnasium space; when left out, the space of the ``env``
            passed in ``metadata``, else inferred from the data (see
            :func:`~rlreplay.checkpoint.episode_columns.infer_space`).
        action_space: a gymnasium space, found as ``observation_space`` is.
        first_id: the first step id (insert count) to read, with ``end_id`` the range
            ``[first_id, end_id)``.
        end_id: the step id (insert count) the range read ends before.
        **metadata: passed to ``minari.create_dataset_from_buffers`` (``env``,
            ``algorithm_name``, ``author``, ``description``, ...).

    Returns:
        The ``minari.MinariDataset`` written.

    Raises:
        DatasetError: if the store lacks the episode columns (the message lists what is
            required), its rows do not continue each other, an EpisodeAdder table's items
            may split episodes, no whole episode is in the range, or the dataset exists
            already.
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
    step_range(store, first_id, end_id)  # a bad range is refused before anything is read
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
    """``dataset`` as a ``minari.MinariDataset``: one already, a dataset id looked up
    under ``root`` (default: Minari's root), or a dataset's directory (a path object, an
    absolute path or one that exists).

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
