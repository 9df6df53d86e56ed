"""Episodes as step rows: the roles an episode needs, and reading whole episodes back.

An episode of ``T`` steps is ``T`` *step rows* with the roles of :data:`DEFAULT_FIELDS`,
read from step rows (:func:`episodes_from_rows`) or an
:class:`~rlreplay.writers.EpisodeAdder` table (:func:`episodes_from_items`). See
docs/checkpoints.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.core.specs import Signature, unflatten
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.datasets.table_contents import StepRange, read_items, read_steps
from rlreplay.errors import DatasetError, InvalidArgumentError, describe

DEFAULT_FIELDS = {
    "observation": "obs",
    "action": "action",
    "reward": "reward",
    "terminated": "terminated",
    "truncated": "truncated",
    "next_observation": "next_obs",
}
ROLES = tuple(DEFAULT_FIELDS)
SCALAR_ROLES = ("reward", "terminated", "truncated")


def resolve_fields(
    signature: Signature, fields: Mapping[str, str] | None, what: str
) -> dict[str, list[str]]:
    """Role to the column paths that hold it (one path, or the leaves under a prefix).

    Args:
        signature: the store's signature.
        fields: roles to rename (the rest keep :data:`DEFAULT_FIELDS`).
        what: the operation, for messages (``"export"``, ``"import"``).

    Raises:
        InvalidArgumentError: for unknown roles in ``fields``.
        DatasetError: naming every role whose column is missing or malformed.
    """
    if fields is not None and (
        not isinstance(fields, Mapping) or not all(isinstance(v, str) for v in fields.values())
    ):
        raise InvalidArgumentError(
            f"fields={describe(fields)} must be a dict of role to column name, e.g. "
            "{'observation': 'state'}"
        )
    unknown = sorted(set(fields or {}) - set(ROLES))
    if unknown:
        raise InvalidArgumentError(
            f"fields names unknown roles {unknown}; the roles are {list(ROLES)}"
        )
    names = {**DEFAULT_FIELDS, **(fields or {})}
    resolved: dict[str, list[str]] = {}
    missing = []
    for role, name in names.items():
        paths = [p for p in signature.paths if p == name or p.startswith(name + "/")]
        if not paths:
            missing.append(f"{role} (column {name!r})")
        resolved[role] = paths
    if missing:
        raise DatasetError(
            f"cannot {what} episodes: the store has no column for {', '.join(missing)}; its "
            f"columns are {list(signature.paths)}. Episodes are read from step rows with an "
            "observation, action, reward, terminated and truncated flag and the next "
            "observation per step (see rlreplay.datasets.episodes); store those "
            "columns, or name yours with fields={role: column}. An EpisodeAdder table "
            "exports its items as episodes; other adder tables keep episodes in rows that "
            "cannot be read back as whole episodes: export those with export_npz"
        )
    for role in SCALAR_ROLES:
        path = resolved[role]
        spec = signature[path[0]] if len(path) == 1 else None
        if spec is None or spec.shape != () or spec.dtype.kind not in "biuf":
            raise DatasetError(
                f"cannot {what} episodes: the {role} column {names[role]!r} must hold one "
                f"number or bool per step; it is {_describe_columns(signature, path)}"
            )
    obs, nxt = resolved["observation"], resolved["next_observation"]
    rel = [p[len(names["observation"]) :] for p in obs]
    rel_next = [p[len(names["next_observation"]) :] for p in nxt]
    same = rel == rel_next and all(signature[a] == signature[b] for a, b in zip(obs, nxt))
    if not same:
        raise DatasetError(
            f"cannot {what} episodes: the observation columns {obs} and the next "
            f"observation columns {nxt} must have the same structure, shapes and dtypes"
        )
    return resolved


def _describe_columns(signature: Signature, paths: list[str]) -> str:
    return ", ".join(f"{p}: shape {signature[p].shape}, {signature[p].dtype}" for p in paths)


def nest(prefix: str, paths: list[str], arrays: Mapping[str, Any]) -> Any:
    """The value of a role: one column's array, or the nested dict under ``prefix/``."""
    if paths == [prefix]:
        return arrays[prefix]
    return unflatten({p[len(prefix) + 1 :]: arrays[p] for p in paths})


def leaves(value: Any, prefix: str) -> dict[str, Any]:
    """Flatten a role's value (an array, or nested dicts of arrays) to column paths."""
    if not isinstance(value, Mapping):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(leaves(sub, f"{prefix}/{key}"))
    return out


def infer_space(value: Any) -> Any:
    """A gymnasium space for a role's exported data (``[n, ...]`` per leaf).

    Floats give an unbounded ``Box``, a scalar integer column >= 0 ``Discrete(max + 1)`` of
    the data, other integers a ``Box``, bools ``MultiBinary``, nested dicts ``Dict``.
    """
    from gymnasium import spaces

    if isinstance(value, Mapping):
        return spaces.Dict({k: infer_space(v) for k, v in value.items()})
    arr = np.asarray(value)
    shape, dtype = arr.shape[1:], arr.dtype
    if dtype.kind == "f":
        return spaces.Box(-np.inf, np.inf, shape, dtype)
    if dtype.kind == "b":
        return spaces.MultiBinary(list(shape)) if shape else spaces.Discrete(2)
    if dtype.kind in "iu":
        if shape == () and (arr.size == 0 or arr.min() >= 0):
            return spaces.Discrete(int(arr.max()) + 1 if arr.size else 1)
        info = np.iinfo(dtype)
        return spaces.Box(info.min, info.max, shape, dtype)
    raise DatasetError(
        f"no gymnasium space fits data of dtype {dtype}; pass observation_space and action_space"
    )


@dataclass(frozen=True)
class Episode:
    """One whole episode of ``T`` steps, as Minari stores it.

    Attributes:
        first_id: step id of its first stored row.
        observations: ``[T + 1, ...]`` (or a nested dict of such arrays).
        actions: ``[T, ...]`` (or a nested dict).
        rewards, terminations, truncations: ``[T]``.
    """

    first_id: int
    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray


def episode_bounds(done: np.ndarray, start_known: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (inclusive) of the whole episodes in one stream's rows."""
    ends = np.flatnonzero(done)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else ends
    if len(ends) and not start_known:
        starts, ends = starts[1:], ends[1:]
    return starts, ends


def episodes_from_rows(
    store: StepStore,
    roles: dict[str, list[str]],
    names: dict[str, str],
    first_id: int | None,
    end_id: int | None,
) -> tuple[StepRange, list[Episode]]:
    """``(span, episodes)``: the range ``[first_id, end_id)`` and the whole episodes in it.

    Raises:
        DatasetError: where a step's next observation is not the next row's observation.
    """
    needed = [p for paths in roles.values() for p in paths]
    lanes = store.lanes

    def ended_before(span: StepRange) -> np.ndarray:
        """Whether each lane's step before the range is stored and ended an episode."""
        before = span.first_id - lanes + np.arange(lanes)
        done_before = np.zeros(lanes, dtype=bool)
        stored = before >= store.oldest_id
        for role in ("terminated", "truncated"):
            flags = store.columns[roles[role][0]][before[stored] % store.capacity]
            done_before[stored] |= flags != 0
        return done_before

    span, data, done_before = read_steps(store, first_id, end_id, needed, ended_before)
    done = (data[roles["terminated"][0]] != 0) | (data[roles["truncated"][0]] != 0)
    found: list[np.ndarray] = []  # row indices of each episode
    for lane in range(lanes):
        lane_rows = np.arange(lane, len(done), lanes)
        _check_continuity(data, roles, lane_rows, done, lanes, span.first_id)
        start_known = span.first_id == 0 or bool(done_before[lane])
        starts, ends = episode_bounds(done[lane_rows], start_known)
        found.extend(lane_rows[s : e + 1] for s, e in zip(starts, ends))
    found.sort(key=lambda idx: int(idx[0]))
    episodes = []
    for idx in found:
        last = idx[-1:]
        observations = {
            o: np.concatenate([data[o][idx], data[x][last]])
            for o, x in zip(roles["observation"], roles["next_observation"])
        }
        episodes.append(
            Episode(
                first_id=span.first_id + int(idx[0]),
                observations=nest(names["observation"], roles["observation"], observations),
                actions=nest(
                    names["action"], roles["action"], {p: data[p][idx] for p in roles["action"]}
                ),
                rewards=data[roles["reward"][0]][idx],
                terminations=data[roles["terminated"][0]][idx] != 0,
                truncations=data[roles["truncated"][0]][idx] != 0,
            )
        )
    return span, episodes


def _check_continuity(
    data: dict[str, np.ndarray],
    roles: dict[str, list[str]],
    lane_rows: np.ndarray,
    done: np.ndarray,
    lanes: int,
    first_id: int,
) -> None:
    """Refuse rows where a step's next observation is not the next row's within an episode."""
    inner = lane_rows[:-1][~done[lane_rows[:-1]]]
    if not len(inner):
        return
    for o, x in zip(roles["observation"], roles["next_observation"]):
        a, b = data[x][inner], data[o][inner + lanes]
        same = a == b if a.dtype.kind != "f" else (a == b) | (np.isnan(a) & np.isnan(b))
        bad = np.flatnonzero(~same.reshape(len(inner), -1).all(axis=1))
        if len(bad):
            raise DatasetError(
                f"step {first_id + int(inner[bad[0]])}'s {x!r} differs from the next step's "
                f"{o!r} in the same lane, though the episode had not ended: the rows are not "
                "one environment's consecutive steps. Store each environment's steps in "
                "order (a vector environment's as lanes of one store, StepStore(..., "
                "lanes=num_envs))"
            )


def is_episode_table(table: Table) -> bool:
    """Whether ``table`` has :class:`~rlreplay.writers.EpisodeAdder`'s layout."""
    from rlreplay.writers import EpisodeAdder

    signature = table.store.signature
    paths = signature.paths
    if not ("reward" in paths and "discount" in paths and _prefixed(paths, "obs")):
        return False
    if not _prefixed(paths, "action"):
        return False
    expected = EpisodeAdder.layout(signature, table.layout.span)
    return table.layout.to_json() == expected.to_json()


def _prefixed(paths: tuple[str, ...], name: str) -> list[str]:
    return [p for p in paths if p == name or p.startswith(name + "/")]


def episodes_from_items(
    table: Table, first_id: int | None, end_id: int | None
) -> tuple[StepRange, list[Episode]]:
    """``(span, episodes)``: the range and the episodes of an EpisodeAdder table's items in it.

    Terminated is told from truncated by the last step's ``discount`` (0 when terminal).

    Raises:
        DatasetError: if an item holds ``max_length`` rows (it may split an episode).
    """
    store, max_rows = table.store, table.layout.span
    signature = store.signature
    obs_paths, action_paths = (
        _prefixed(signature.paths, "obs"),
        _prefixed(signature.paths, "action"),
    )
    fields = [*obs_paths, *action_paths, "reward", "discount"]
    span, copied, items = read_steps(
        store, first_id, end_id, fields, lambda span: read_items(table, span)
    )
    full = np.flatnonzero(items.extents >= max_rows)
    if len(full):
        raise DatasetError(
            f"table {table.name!r} holds items of max_length={max_rows} rows (the one "
            f"anchored at step {int(items.anchor_ids[full[0]])} first): such an item may "
            "be part of a longer episode, which its items alone cannot join. Use an "
            "EpisodeAdder whose max_length exceeds every episode's steps + 1, or export "
            "with export_npz"
        )
    keep = items.extents >= 2  # a step and the final observation
    anchors, extents = items.anchor_ids[keep], items.extents[keep]
    offsets = np.repeat(np.cumsum(extents) - extents, extents)
    steps = np.arange(int(extents.sum())) - offsets  # row within its item
    rows = np.repeat(anchors - span.first_id, extents) + steps * store.lanes
    data = {p: column[rows] for p, column in copied.items()}
    episodes = []
    for first, lo, n in zip(anchors, np.cumsum(extents) - extents, extents):
        steps_of = slice(lo, lo + n - 1)  # the final row holds only the last observation
        terminal = bool(data["discount"][lo + n - 2] == 0)
        flags = np.zeros(n - 1, dtype=bool)
        terminations, truncations = flags.copy(), flags.copy()
        (terminations if terminal else truncations)[-1] = True
        episodes.append(
            Episode(
                first_id=int(first),
                observations=nest("obs", obs_paths, {p: data[p][lo : lo + n] for p in obs_paths}),
                actions=nest("action", action_paths, {p: data[p][steps_of] for p in action_paths}),
                rewards=data["reward"][steps_of],
                terminations=terminations,
                truncations=truncations,
            )
        )
    return span, episodes
