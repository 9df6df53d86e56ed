"""Episodes as step columns: which stored columns hold what a Minari episode needs.

A Minari episode of ``T`` steps has ``T + 1`` observations and ``T`` actions, rewards,
``terminations`` and ``truncations``. rlreplay stores it as ``T`` *step rows* (the
cpprb/Stable-Baselines3 convention) with these *roles*, each a column or, for nested
observations and actions, a prefix of columns (``obs/image``, ``obs/state``):

==================== ============ =====================================================
role                 default      holds, for the step at row ``t``
==================== ============ =====================================================
``observation``      ``obs``      the observation the step was taken from
``action``           ``action``   the action taken
``reward``           ``reward``   the reward received (a scalar column)
``terminated``       ``terminated`` whether the step ended the episode in a terminal state
``truncated``        ``truncated`` whether the episode was cut off after it (time limit)
``next_observation`` ``next_obs`` the observation the step led to (after the episode's
                                  last step, its final observation)
==================== ============ =====================================================

An episode is the rows of one stream (one lane of the store) up to and including a row
with ``terminated`` or ``truncated`` set. Pass ``fields={"observation": "state", ...}``
to name other columns. This module maps roles to columns and gymnasium spaces; it
imports gymnasium only when a space is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.specs import Signature, unflatten
from rlreplay.errors import DatasetError, InvalidArgumentError, describe

__all__ = ["DEFAULT_FIELDS", "ROLES", "infer_space", "resolve_fields", "nest", "leaves"]

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
        DatasetError: naming every role whose column is missing, or a reward or flag
            column that is not one number per step; says what is required.
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
            "observation per step (see rlreplay.checkpoint.episode_columns); store those "
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
    """The value of a role: the array itself for one column named ``prefix``, else the
    nested dict of the columns under ``prefix/``."""
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

    Floats become an unbounded ``Box``; a scalar integer column of values >= 0 becomes
    ``Discrete(max + 1)`` (its largest value in the data: give the space when the data
    may miss the largest action); other integers become a ``Box`` over their dtype's
    range; bool arrays become ``MultiBinary`` (a scalar bool ``Discrete(2)``); nested
    dicts become ``Dict`` spaces.
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
