"""Minari datasets out of and into replay: the gymnasium ecosystem's offline-RL format.

:func:`export_minari` writes the episodes held in a store's step rows (see
:mod:`rlreplay.checkpoint.episode_columns` for the columns required) as a Minari dataset
that ``minari.load_dataset`` reads. :func:`import_minari` pre-fills replay from a Minari
dataset: directly into a table of step rows (one item per step), or through an adder,
which turns the episodes into its own items (n-step transitions, sequences, episodes).

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

from rlreplay.checkpoint.episode_columns import (
    DEFAULT_FIELDS,
    infer_space,
    nest,
    resolve_fields,
)
from rlreplay.checkpoint.table_contents import step_range
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import DatasetError, InvalidArgumentError, describe

__all__ = ["episode_bounds", "export_minari", "load_dataset"]

_ROOT_LOCK = threading.Lock()


@contextmanager
def _datasets_root(root: str | os.PathLike | None) -> Iterator[None]:
    """Point Minari at ``root`` for the calls inside (Minari reads the root from the
    ``MINARI_DATASETS_PATH`` environment variable only); one such call at a time."""
    if root is None:
        yield
        return
    with _ROOT_LOCK:
        old = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = os.fspath(root)
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


def episode_bounds(done: np.ndarray, start_known: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (inclusive) of the whole episodes in one stream's rows.

    ``done[t]`` marks a row that ended its episode. Rows after the last such row belong
    to an episode still running and are left out; so are the rows before the first one
    unless ``start_known`` (the stream's first row starts an episode).
    """
    ends = np.flatnonzero(done)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else ends
    if len(ends) and not start_known:
        starts, ends = starts[1:], ends[1:]
    return starts, ends


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
    """Write the whole episodes in a store's step rows as a Minari dataset.

    Each lane of the store is one stream of steps; an episode is its rows up to and
    including a row with ``terminated`` or ``truncated`` set, and its observations are
    the rows' observations plus the last row's next observation. Rows of an episode that
    had not ended are left out, and so are the rows before the first episode end unless
    the range starts at step 0 or right after a stored step that ended an episode (the
    episode's start may have been overwritten). Consecutive rows of an episode must
    continue each other (``next_obs`` of one is ``obs`` of the next), which is checked.

    Args:
        source: a :class:`Table` (its store's steps are exported) or a :class:`StepStore`.
        dataset_id: Minari's dataset id, e.g. ``"cartpole/random-v0"``; it must not exist.
        root: directory Minari keeps datasets in (default: Minari's own).
        fields: role to column name, for columns not named as in
            :data:`~rlreplay.checkpoint.episode_columns.DEFAULT_FIELDS`.
        observation_space, action_space: gymnasium spaces; when left out, the spaces of
            the ``env`` passed in ``metadata``, else inferred from the data (see
            :func:`~rlreplay.checkpoint.episode_columns.infer_space`).
        first_id, end_id: the step ids (insert counts) ``[first_id, end_id)`` to read.
        **metadata: passed to ``minari.create_dataset_from_buffers`` (``env``,
            ``algorithm_name``, ``author``, ``description``, ...).

    Returns:
        The ``minari.MinariDataset`` written.

    Raises:
        DatasetError: if the store lacks the episode columns (the message lists what is
            required), its rows do not continue each other, no whole episode is in the
            range, or the dataset exists already.
        InvalidArgumentError: for a bad ``source``, ``fields`` or range.
    """
    minari = _minari()
    store = _source_store(source)
    roles = resolve_fields(store.signature, fields, "export")
    with _datasets_root(root):
        from minari.storage.datasets_root_dir import get_dataset_path

        if isinstance(dataset_id, str) and get_dataset_path(dataset_id).exists():
            raise DatasetError(
                f"a Minari dataset {dataset_id!r} exists already under "
                f"{get_dataset_path()}; choose another id or version (e.g. '-v1'), or "
                "delete it first (minari.delete_dataset)"
            )
    names = {**DEFAULT_FIELDS, **(fields or {})}
    needed = [p for paths in roles.values() for p in paths]
    with store.mutex:
        span = step_range(store, first_id, end_id)
        rows = np.arange(span.first_id, span.end_id, dtype=np.int64) % store.capacity
        data = {p: store.columns[p][rows] for p in needed}
        before = span.first_id - store.lanes + np.arange(store.lanes)
        stored_before = before >= store.oldest_id
        done_before = np.zeros(store.lanes, dtype=bool)
        if stored_before.any():
            prev = before[stored_before] % store.capacity
            flags = [store.columns[roles[r][0]][prev] != 0 for r in ("terminated", "truncated")]
            done_before[stored_before] = flags[0] | flags[1]
    buffers = _episodes(data, roles, names, store.lanes, span.first_id, done_before)
    if not buffers:
        raise DatasetError(
            f"steps [{span.first_id}, {span.end_id}) hold no whole episode (none ends with "
            "terminated or truncated set after a known start); nothing was written"
        )
    obs_all = nest(names["observation"], roles["observation"], data)
    act_all = nest(names["action"], roles["action"], data)
    env_given = metadata.get("env") is not None  # Minari then takes the env's spaces
    if observation_space is None and not env_given:
        observation_space = infer_space(obs_all)
    if action_space is None and not env_given:
        action_space = infer_space(act_all)
    kwargs = dict(metadata)
    params = inspect.signature(minari.create_dataset_from_buffers).parameters
    if "jpeg_encoding" in params:
        kwargs.setdefault("jpeg_encoding", False)  # lossless, as stored
    if "data_format" in params:
        kwargs.setdefault("data_format", "hdf5")
    with _datasets_root(root):
        return minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            observation_space=observation_space,
            action_space=action_space,
            **kwargs,
        )


def _episodes(
    data: dict[str, np.ndarray],
    roles: dict[str, list[str]],
    names: dict[str, str],
    lanes: int,
    first_id: int,
    done_before: np.ndarray,
) -> list[Any]:
    """Minari episode buffers of the whole episodes in ``data`` (rows in step-id order)."""
    from minari.data_collector import EpisodeBuffer

    term = data[roles["terminated"][0]] != 0
    trunc = data[roles["truncated"][0]] != 0
    n = len(term)
    found: list[tuple[int, np.ndarray]] = []  # (first step id, row indices) per episode
    for lane in range(lanes):
        lane_rows = np.arange(lane, n, lanes)
        start_known = first_id == 0 or bool(done_before[lane])
        starts, ends = episode_bounds((term | trunc)[lane_rows], start_known)
        _check_continuity(data, roles, lane_rows, term | trunc, first_id)
        for s, e in zip(starts, ends):
            idx = lane_rows[s : e + 1]
            found.append((first_id + int(idx[0]), idx))
    found.sort(key=lambda f: f[0])
    buffers = []
    for number, (_, idx) in enumerate(found):
        obs = {p: data[p][idx] for p in roles["observation"]}
        last = {
            o: data[x][idx[-1:]] for o, x in zip(roles["observation"], roles["next_observation"])
        }
        observations = {p: np.concatenate([obs[p], last[p]]) for p in obs}
        buffers.append(
            EpisodeBuffer(
                id=number,
                observations=nest(names["observation"], roles["observation"], observations),
                actions=nest(
                    names["action"], roles["action"], {p: data[p][idx] for p in roles["action"]}
                ),
                rewards=data[roles["reward"][0]][idx],
                terminations=term[idx],
                truncations=trunc[idx],
                infos={},  # Minari's reader expects a dict
            )
        )
    return buffers


def _check_continuity(
    data: dict[str, np.ndarray],
    roles: dict[str, list[str]],
    lane_rows: np.ndarray,
    done: np.ndarray,
    first_id: int,
) -> None:
    """Refuse rows of one stream where a step's next observation is not the next row's
    observation within an episode (several environments' steps interleaved in a lane)."""
    inner = lane_rows[:-1][~done[lane_rows[:-1]]]  # rows followed by their episode's next
    lanes_step = lane_rows[1] - lane_rows[0] if len(lane_rows) > 1 else 1
    for o, x in zip(roles["observation"], roles["next_observation"]):
        a, b = data[x][inner], data[o][inner + lanes_step]
        same = a == b if a.dtype.kind != "f" else (a == b) | (np.isnan(a) & np.isnan(b))
        bad = np.flatnonzero(~same.reshape(len(inner), -1).all(axis=1))
        if len(bad):
            step = first_id + int(inner[bad[0]])
            raise DatasetError(
                f"step {step}'s {x!r} differs from the next step's {o!r} in the same lane, "
                "though the episode had not ended: the rows are not one environment's "
                "consecutive steps. Store each environment's steps in order (a vector "
                "environment's as lanes of one store, StepStore(..., lanes=num_envs))"
            )


def load_dataset(dataset: Any, root: str | os.PathLike | None = None) -> Any:
    """``dataset`` as a ``minari.MinariDataset``: one already, a dataset id looked up
    under ``root`` (default: Minari's root), or a dataset's directory (a path object, an
    absolute path or one that exists).

    Raises:
        InvalidArgumentError: for anything else.
        FileNotFoundError: (Minari's) for an id not found under the root.
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
            return minari.load_dataset(dataset)
    raise InvalidArgumentError(
        f"dataset={describe(dataset)} must be a minari.MinariDataset, a dataset id or the "
        "path of a dataset's directory"
    )
