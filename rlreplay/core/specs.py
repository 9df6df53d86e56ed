"""Signatures: the named fields of a step, each with a fixed shape and dtype.

Nested dicts flatten to paths such as ``"obs/image"``, which the rest of the library uses.
gymnasium spaces are recognised by their class (gymnasium is never imported).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.core.spec_checks import (
    EXAMPLE,
    SEPARATOR,
    checked_dtype,
    checked_shape,
    empty_branch,
    is_dtype,
    swapped_example,
)
from rlreplay.core.value_casting import as_column_array, cast_problem, float_fits, refusal
from rlreplay.errors import InvalidArgumentError, SignatureError, describe

__all__ = [
    "SEPARATOR", "FieldSpec", "Signature", "cast_problem", "flatten", "unflatten",
]


@dataclass(frozen=True)
class FieldSpec:
    """Shape (without the leading step axis) and dtype of one stored field.

    Args:
        shape: an int or a tuple of ints >= 0 (``()`` for a scalar).
        dtype: one numpy dtype of fixed size, e.g. ``"float32"``, ``np.uint8``, ``"U16"``.

    Raises:
        InvalidArgumentError: for a bad shape, or a dtype that is ambiguous, structured,
            subarray, object, unsized string/bytes or a unitless datetime.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, shape: int | tuple[int, ...] = (), dtype: Any = np.float32):
        shape = checked_shape(shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", checked_dtype(dtype, shape))

    @property
    def nbytes(self) -> int:
        """Bytes one step of this field occupies."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype.str}

    @classmethod
    def from_json(cls, data: Mapping) -> FieldSpec:
        return cls(tuple(data["shape"]), np.dtype(data["dtype"]))


def _as_spec(path: str, leaf: Any) -> FieldSpec:
    """The :class:`FieldSpec` a signature's ``leaf`` at ``path`` describes."""
    if isinstance(leaf, FieldSpec):
        return leaf
    try:
        if isinstance(leaf, tuple) and len(leaf) == 2:
            if is_dtype(leaf[0]):
                raise InvalidArgumentError(
                    f"{describe(leaf)} gives the dtype first; give (shape, dtype), "
                    f"e.g. {swapped_example(leaf)}"
                )
            return FieldSpec(leaf[0], leaf[1])
        if isinstance(leaf, (tuple, list)):
            toml = (
                "; a {'shape': ..., 'dtype': ...} table is the form of config files: in "
                "Python give (shape, dtype)"
                if path.rsplit(SEPARATOR, 1)[-1] == "shape"
                else ""
            )
            raise InvalidArgumentError(
                f"{describe(leaf)} is not a spec; give a FieldSpec, a (shape, dtype) tuple, "
                f"e.g. {EXAMPLE}, or a dtype{toml}"
            )
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if isinstance(shape, tuple) and dtype is not None:
            return FieldSpec(shape, dtype)  # a gymnasium space, an array, a ShapeDtypeStruct
        if _is_space(leaf):
            raise InvalidArgumentError(
                f"{describe(leaf)} is a gymnasium {type(leaf).__name__} space, whose values "
                "have no fixed shape and dtype; spaces stored are Box, Discrete, MultiDiscrete, "
                f"MultiBinary, and Dict and Tuple of them: give a (shape, dtype) spec, e.g. "
                f"{EXAMPLE}, for what you store of it"
            )
        if isinstance(leaf, type) and _is_space_class(leaf):
            raise InvalidArgumentError(
                f"{describe(leaf)} is the gymnasium space class {leaf.__name__}, not a space; "
                f"give a space, e.g. env.single_observation_space or {leaf.__name__}(...)"
            )
        return FieldSpec((), leaf)  # refused, named, as no dtype
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"signature field {path!r}: {exc}") from None


def _is_space(value: Any) -> bool:
    """Whether ``value`` is a gymnasium (or gym) space, told by its class."""
    return _is_space_class(type(value))


def _is_space_class(cls: type) -> bool:
    return any(
        c.__name__ == "Space" and c.__module__.split(".")[0] in ("gymnasium", "gym")
        for c in cls.__mro__
    )


def _spec_tree(tree: Any) -> Any:
    """``tree`` with gymnasium ``Dict`` and ``Tuple`` spaces as nested dicts."""
    if _is_space(tree) and isinstance(getattr(tree, "spaces", None), tuple):
        if isinstance(tree, Sequence):  # a Tuple space (OneOf holds spaces but is none)
            return {str(i): _spec_tree(s) for i, s in enumerate(tree.spaces)}
        return tree
    if isinstance(tree, Mapping):  # a dict, or a gymnasium Dict space
        return {key: _spec_tree(value) for key, value in tree.items()}
    return tree


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``{"a/b": leaf}``; a key may itself be a path.

    Raises:
        InvalidArgumentError: for a bad key, or a field given twice (nested and by its path).
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not all(key.split(SEPARATOR)):
            raise InvalidArgumentError(
                f"field name {describe(key)} must be a non-empty string; nest dicts for "
                f"nested fields or name them by their path, e.g. 'obs{SEPARATOR}image'"
            )
        path = prefix + key
        leaves = flatten(value, path + SEPARATOR) if isinstance(value, Mapping) else {path: value}
        twice = [p for p in leaves if p in out]
        if twice:
            raise InvalidArgumentError(
                f"field {twice[0]!r} is given twice (nested and by its path); give it once"
            )
        out.update(leaves)
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten`."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(SEPARATOR)
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _value_at(tree: Any, path: str) -> Any:
    """The value at ``path`` in ``tree`` (nested dicts and tuples), or ``None``."""
    if isinstance(tree, Mapping):
        value = tree.get(path)
        if value is not None:
            return value
        for key, value in tree.items():
            if isinstance(key, str) and path.startswith(key + SEPARATOR):
                found = _value_at(value, path[len(key) + 1 :])
                if found is not None:
                    return found
        return None
    if type(tree) is tuple:
        head, _, rest = path.partition(SEPARATOR)
        if head.isdigit() and int(head) < len(tree):
            return _value_at(tree[int(head)], rest) if rest else tree[int(head)]
    return None


def checked_extras(extras: Any, reserved: Sequence[str], owner: str) -> dict[str, Any]:
    """``extras`` as a new dict, checked not to name ``reserved`` fields.

    Raises:
        InvalidArgumentError: for extras that are not a dict, or that name a reserved field.
    """
    if extras is None:
        return {}
    if not isinstance(extras, Mapping):
        raise InvalidArgumentError(
            f"extras={describe(extras)} must be a dict of field name to spec, e.g. "
            "{'logp': 'float32'}"
        )
    clash = [k for k in extras if k in reserved]
    if clash:
        raise InvalidArgumentError(
            f"extras name {clash}, which {owner} fills itself (reserved: {list(reserved)}); "
            "rename them"
        )
    return dict(extras)


class Signature:
    """Ordered mapping of field path to :class:`FieldSpec`.

    Args:
        fields: a (possibly nested) dict whose leaves are specs (a :class:`FieldSpec`, a
            ``(shape, dtype)`` tuple, a dtype for a scalar, an object with ``shape`` and
            ``dtype``, or a gymnasium space), or a :class:`Signature`.

    Raises:
        InvalidArgumentError: naming the field, for an empty signature, a bad name, a
            ``(dtype, shape)`` tuple, a space without a fixed shape, or no spec.

    Example:
        >>> sig = Signature({"obs": {"image": ((84, 84), "uint8")}, "reward": "float32"})
        >>> sig.paths
        ('obs/image', 'reward')
    """

    def __init__(self, fields: Mapping[str, Any] | Signature):
        if not isinstance(fields, Signature):
            fields = _spec_tree(fields)
        if isinstance(fields, Signature):
            self.fields: dict[str, FieldSpec] = dict(fields.fields)
        elif not isinstance(fields, Mapping) or not fields:
            one_field = _is_space(fields) or hasattr(fields, "dtype")
            raise InvalidArgumentError(
                f"signature={describe(fields)} must be a non-empty dict of field specs, "
                f"e.g. {{'obs': {EXAMPLE}, 'reward': 'float32'}}"
                + (
                    "; this is one field's spec: name it, as in {'obs': spec}, or "
                    "give Signature.from_spaces(env.observation_space, env.action_space)"
                    if one_field else ""
                )
            )
        elif (empty := empty_branch(fields)) is not None:
            raise InvalidArgumentError(
                f"signature field {empty!r} is empty (a dict, Dict space or Tuple space of "
                "no fields); give it fields or leave it out"
            )
        else:
            self.fields = {p: _as_spec(p, leaf) for p, leaf in flatten(fields).items()}
            # a path that also leads to nested fields would lose one or the other in tree()
            branches = {p.rsplit(SEPARATOR, k)[0] for p in self.fields
                        for k in range(1, p.count(SEPARATOR) + 1)}
            clash = [p for p in self.fields if p in branches]
            if clash:
                raise InvalidArgumentError(
                    f"signature field {clash[0]!r} is both a field and a branch of nested "
                    f"fields ({[p for p in self.fields if p.startswith(clash[0] + SEPARATOR)]}); "
                    "rename one of them"
                )
        self._checks = tuple(
            (p, spec.shape, len(spec.shape), spec.dtype) for p, spec in self.fields.items()
        )
        self._paths = self.fields.keys()
        # row_count tells one row from a batch by the first field's number of dimensions.
        self._row_probe = self._checks[0][0], self._checks[0][2]

    @classmethod
    def from_spaces(
        cls,
        observation_space: Any,
        action_space: Any,
        extras: Mapping[str, Any] | None = None,
        reward: Any = "float32",
    ) -> Signature:
        """The signature of one environment step (``obs``, ``action``, ``reward``, extras).

        Args:
            observation_space: one environment's observation space (a vector env's
                ``single_observation_space``), or any spec.
            action_space: one environment's action space, or any spec.
            extras: more fields, each a space or a spec, e.g. ``{"terminated": "bool"}``.
            reward: the reward's spec.

        Raises:
            InvalidArgumentError: naming the field, for a space without a fixed shape, a
                non-spec, or extras named ``obs``, ``action`` or ``reward``.

        Example:
            >>> import gymnasium as gym
            >>> env = gym.make("CartPole-v1")
            >>> Signature.from_spaces(env.observation_space, env.action_space)
            Signature(obs: float32[4], action: int64[], reward: float32[])
        """
        extras = checked_extras(extras, ("obs", "action", "reward"), "from_spaces")
        return cls({"obs": observation_space, "action": action_space, "reward": reward, **extras})

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self.fields)

    @property
    def step_nbytes(self) -> int:
        return sum(spec.nbytes for spec in self.fields.values())

    def __getitem__(self, path: str) -> FieldSpec:
        try:
            return self.fields[path]
        except KeyError:
            raise SignatureError(
                f"unknown field {path!r}; the signature has {list(self.fields)}"
            ) from None

    def __contains__(self, path: object) -> bool:
        return path in self.fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and self.fields == other.fields

    def __repr__(self) -> str:
        inner = ", ".join(f"{p}: {spec.dtype}{list(spec.shape)}" for p, spec in self.fields.items())
        return f"Signature({inner})"

    def to_json(self) -> dict:
        return {p: spec.to_json() for p, spec in self.fields.items()}

    @classmethod
    def from_json(cls, data: Mapping) -> Signature:
        """The signature :meth:`to_json` wrote.

        Raises:
            InvalidArgumentError: for a malformed field spec.
        """
        return cls(unflatten({p: FieldSpec.from_json(v) for p, v in data.items()}))

    def check_batch(self, data: Mapping[str, Any], argument: str = "data") -> tuple[dict, int]:
        """Validate a batch of steps (every field has a leading batch axis).

        Args:
            data: nested or flat dict with one array per field, each ``[n, *shape]``.
            argument: the argument's name, for error messages.

        Returns:
            ``(flat dict of numpy arrays, n)``.

        Raises:
            SignatureError: on missing or unknown fields, wrong shapes, values the dtype cannot
                hold, or differing batch sizes.
        """
        flat = self._flat_fields(data, argument)
        out: dict[str, np.ndarray] = {}
        n = -1
        for path, shape, ndim, dtype in self._checks:
            value = arr = flat[path]
            if type(arr) is not np.ndarray:
                leaf = self._leaf(arr, data, argument)
                arr = as_column_array(leaf, dtype, f"{argument}[{path!r}]")
            if arr.ndim != ndim + 1 or arr.shape[1:] != shape:
                axes = ", ".join(["batch", *map(str, shape)]) + ("," if not shape else "")
                mixed = (
                    f" (one row, where the fields before it hold a batch of {n}: give every "
                    "field a batch axis, or none)"
                    if argument == "rows" and n != -1 and arr.shape == shape
                    else ""
                )
                raise SignatureError(
                    f"{argument}[{path!r}] has shape {arr.shape}; expected ({axes}): a batch "
                    f"of rows of shape {shape}{mixed}"
                )
            if arr.dtype != dtype:
                refused = refusal(argument, path, arr, dtype, value)
                if refused is not None:
                    raise SignatureError(refused)
            if n == -1:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise SignatureError(
                    f"{argument} fields have different batch sizes: {path!r} has "
                    f"{arr.shape[0]}, an earlier field has {n}"
                )
            out[path] = arr
        return out, n

    def check_step(self, data: Mapping[str, Any], argument: str = "step") -> dict:
        """Validate one step (no batch axis). Returns a flat dict of numpy arrays.

        Raises:
            SignatureError: as :meth:`check_batch`.
        """
        return self.check_row(data, argument, keep_floats=False)

    def check_row(self, data: Mapping[str, Any], argument: str, keep_floats: bool = True) -> dict:
        """Validate one step like :meth:`check_step`; ``keep_floats`` keeps scalar Python floats.

        Raises:
            SignatureError: as :meth:`check_batch`.
        """
        flat = self._flat_fields(data, argument)
        out = {}
        for path, shape, _, dtype in self._checks:
            value = flat[path]
            if type(value) is np.ndarray:
                arr = value
            elif (
                keep_floats
                and type(value) is float
                and not shape
                and dtype.kind in "fc"
                and ((dtype.itemsize >= 8 and dtype.kind == "f") or float_fits(value, dtype))
            ):
                out[path] = value
                continue
            else:
                arr = as_column_array(
                    self._leaf(value, data, argument), dtype, f"{argument}[{path!r}]"
                )
            if arr.shape != shape:
                mixed = (
                    " (a batch, where the first field holds one row: give every field a "
                    "batch axis, or none)"
                    if argument == "rows" and out and arr.shape[1:] == shape
                    else ""
                )
                raise SignatureError(
                    f"{argument}[{path!r}] has shape {arr.shape}; expected {shape}{mixed}"
                )
            if arr.dtype != dtype:
                refused = refusal(argument, path, arr, dtype, value)
                if refused is not None:
                    raise SignatureError(refused)
            out[path] = arr
        return out

    def row_count(self, rows: Any) -> tuple[bool, int | None]:
        """``(one_row, n)`` of insert ``rows``, by the first field (``n`` may be ``None``)."""
        path, ndim = self._row_probe
        if type(rows) is not dict and not isinstance(rows, Mapping):
            return False, None
        probe = rows.get(path)
        if probe is None and SEPARATOR in path:  # nested: rows["obs"]["pos"], or a tuple
            probe = _value_at(rows, path)
        if probe is None:
            return False, None
        if type(probe) is np.ndarray:
            if probe.ndim == ndim:
                return True, 1
            if probe.ndim == ndim + 1 and type(rows) is dict:
                return False, len(probe)
            return False, None
        try:
            return (True, 1) if np.ndim(probe) == ndim else (False, None)
        except ValueError:  # ragged nested lists: the validation names the field
            return False, None

    def _flat_fields(self, data: Any, argument: str) -> Mapping[str, Any]:
        """``data`` flattened to paths, with exactly the signature's fields."""
        if type(data) is dict and data.keys() == self._paths:
            return data  # values that are dicts are caught by _leaf
        return self._flatten(data, argument)

    def _tuple_fields(self, nested: str) -> set[str]:
        """The positions ``"0"``, ``"1"``, ... of a ``Tuple`` space's fields under ``nested``."""
        parts = {f[len(nested) :].split(SEPARATOR)[0] for f in self.fields if f.startswith(nested)}
        return parts if parts == {str(i) for i in range(len(parts))} else set()

    def _untupled(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """``flat`` with tuples given for ``Tuple`` space fields spread over them."""
        out: dict[str, Any] = {}

        def spread(path: str, value: Any) -> None:
            nested = path + SEPARATOR
            if isinstance(value, Mapping):
                for key, item in value.items():
                    spread(nested + str(key), item)
            elif (
                type(value) is tuple
                and path not in self.fields
                and len(value) == len(self._tuple_fields(nested))
            ):
                for i, item in enumerate(value):
                    spread(nested + str(i), item)
            else:
                out[path] = value

        for path, value in flat.items():
            spread(path, value)
        return out

    def _leaf(self, value: Any, data: Any, argument: str) -> Any:
        """``value`` if it is not a dict; for a dict, raise the slow path's error."""
        if isinstance(value, Mapping):
            self._flatten(data, argument)
        return value

    def _flatten(self, data: Any, argument: str) -> Mapping[str, Any]:
        flat = flatten(data) if isinstance(data, Mapping) else None
        if flat is None:
            raise SignatureError(f"{argument} must be a dict of arrays, got {describe(data)}")
        if flat.keys() != self.fields.keys():  # a Tuple space's value, given as a tuple?
            flat = self._untupled(flat)
        if flat.keys() != self.fields.keys():
            missing = [p for p in self.fields if p not in flat]
            extra = [p for p in flat if p not in self.fields]
            for p in extra:
                width = len(self._tuple_fields(p + SEPARATOR))
                value = flat[p]
                if width and isinstance(value, (tuple, list)):
                    raise SignatureError(
                        f"{argument}[{p!r}] is a {type(value).__name__} of {len(value)} "
                        f"value(s); the Tuple space there takes a tuple of {width} values "
                        f"(fields {p}/0 .. {p}/{width - 1}, as gymnasium gives them), or a "
                        f"dict of them by position; missing {missing}"
                    )
            raise SignatureError(
                f"{argument} fields do not match the signature: missing {missing}, "
                f"unknown {extra}; expected exactly {list(self.fields)}"
            )
        return flat
