"""What an adder call must receive, checked against the store's signature up front.

:class:`StepInputs` checks every argument of a call with the signature's own rules
(:meth:`Signature.check_batch` / :meth:`Signature.check_row`) before the adder changes
anything, so a rejected call leaves the adder exactly as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.specs import SEPARATOR, Signature, flatten, unflatten
from rlreplay.errors import InvalidArgumentError, SignatureError, describe

_BOOL = np.dtype(bool)


def _is_obs(path: str) -> bool:
    return path == "obs" or path.startswith("obs" + SEPARATOR)


class StepInputs:
    """The per-call inputs of an adder and their checks, derived from the step signature.

    Given fields are ``obs`` (or ``obs/...``), ``action``, ``reward`` and the other
    non-computed fields (*extras*); checked values have a leading ``num_envs`` axis.

    Args:
        signature: the store's step signature.
        computed: fields the adder computes itself.
        num_envs: environments per call.
        batched: whether inputs carry the ``num_envs`` axis.
        stacked_obs: observations arrive as ``[k, *frame]`` stacks (the newest frame is kept).

    Raises:
        InvalidArgumentError: if the signature lacks ``obs``, ``action``, ``reward`` or a
            computed field.
    """

    def __init__(
        self,
        signature: Signature,
        computed: tuple[str, ...],
        num_envs: int,
        batched: bool,
        stacked_obs: bool = False,
    ):
        lacking = [p for p in ("action", "reward", *computed) if p not in signature]
        if not any(_is_obs(p) for p in signature.paths):
            lacking.append("obs")
        if lacking:
            raise InvalidArgumentError(
                f"the writer's signature {signature} lacks the fields {lacking} this adder "
                "stores; build it with the adder's signature(obs=..., action=...)"
            )
        self.signature = signature
        self.num_envs = num_envs
        self.batched = batched
        self.stacked_obs = stacked_obs
        self.paths = tuple(p for p in signature.paths if p not in computed)
        self.obs_paths = tuple(p for p in self.paths if _is_obs(p))
        self.extras = tuple(p for p in self.paths if p not in ("action", "reward", *self.obs_paths))
        # Signatures over add()'s arguments and over an observation: one check each.
        self._step_names = {p: self._arg_path(p) for p in self.paths}
        self._step = Signature(unflatten({a: signature[p] for p, a in self._step_names.items()}))
        self._obs = Signature(unflatten({p: signature[p] for p in self.obs_paths}))
        self._field_args = [(p, a) for p, a in self._step_names.items() if p not in self.obs_paths]
        # One obs array and flat extras: no flattening per call.
        self._flat_extras = (
            self.obs_paths == ("obs",)
            and not stacked_obs
            and all(SEPARATOR not in p for p in self.extras)
        )
        self._extra_args = {p: self._step_names[p] for p in self.extras}
        self._obs_args = [(p, self._step_names[p]) for p in self.obs_paths]
        self._plain = sorted(self.paths) == ["action", "obs", "reward"] and not stacked_obs
        # Fast check for arrays of known shape and admitted dtype (_admit); else the full one.
        self._admitted: dict[str, set[np.dtype]] | None = None
        if batched and self._flat_extras:
            self._admitted = {p: {signature[p].dtype} for p in self.paths}
            self._shapes = {p: (num_envs, *signature[p].shape) for p in self.paths}
        self._flag_shape = (num_envs,) if batched else ()
        self._one_flag = {flag: np.full(1, flag) for flag in (False, True)}
        for arr in self._one_flag.values():
            arr.flags.writeable = False

    @staticmethod
    def _arg_path(path: str) -> str:
        if path in ("action", "reward"):
            return path
        if _is_obs(path):
            return "next_" + path
        return "extras" + SEPARATOR + path

    def step(
        self, action: Any, reward: Any, next_obs: Any, extras: Mapping[str, Any] | None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Check one ``add()`` call's step values; returns ``(fields, obs)``, path to
        ``[num_envs, ...]`` arrays for action, reward and extras, and for the observations.

        Raises:
            SignatureError: for a missing or unknown field, a wrong shape or an unfitting value.
            InvalidArgumentError: for a batch of the wrong number of environments.
        """
        if self._admitted is not None:
            fast = self._step_fast(action, reward, next_obs, extras)
            if fast is not None:
                return fast
        fields, obs = self._step_checked(action, reward, next_obs, extras)
        if self._admitted is not None:
            self._admit(fields)
            self._admit(obs)
        return fields, obs

    def _step_fast(
        self, action: Any, reward: Any, next_obs: Any, extras: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """:meth:`step` for values known to pass the full check, else ``None``."""
        if extras is None:
            extras = {}
        if type(extras) is not dict or len(extras) != len(self.extras):
            return None
        fields = {"action": action, "reward": reward}
        for p in self.extras:
            value = extras.get(p)
            if value is None:
                return None
            fields[p] = value
        shapes, admitted = self._shapes, self._admitted
        for p, v in fields.items():
            if type(v) is not np.ndarray or v.shape != shapes[p] or v.dtype not in admitted[p]:
                return None
        v = next_obs
        if type(v) is not np.ndarray or v.shape != shapes["obs"] or v.dtype not in admitted["obs"]:
            return None
        return fields, {"obs": next_obs}

    def _admit(self, checked: dict[str, np.ndarray]) -> None:
        """Remember dtypes the full check admitted where it decides on dtype alone."""
        for p, arr in checked.items():
            src, col = arr.dtype, self.signature[p].dtype
            narrowed = src.kind in "iu" and col.kind in "iu" and not np.can_cast(src, col)
            if src.kind != "O" and not narrowed:
                self._admitted[p].add(src)

    def _step_checked(
        self, action: Any, reward: Any, next_obs: Any, extras: Mapping[str, Any] | None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """:meth:`step` through the signature's full check."""
        if extras is not None and not isinstance(extras, Mapping):
            raise InvalidArgumentError(
                f"extras={describe(extras)} must be a dict of per-step fields or None"
            )
        if self._plain and not extras:  # the common case: no extras, one obs array
            data = {"action": action, "reward": reward, "next_obs": next_obs}
            checked = self._check(self._step, data, "add()")
            return (
                {"action": checked["action"], "reward": checked["reward"]},
                {"obs": checked["next_obs"]},
            )
        data: dict[str, Any] | None = None
        if (
            self._flat_extras
            and type(extras) is dict
            and extras.keys() == self._extra_args.keys()
        ):
            data = {"action": action, "reward": reward, "next_obs": next_obs}
            for p, a in self._extra_args.items():
                data[a] = extras[p]
            if not all(type(v) is np.ndarray for v in data.values()):
                data = None  # other values take the nested form (and its error messages)
        if data is None and not self.stacked_obs:
            # No name holds a separator: the nested dict is the flat one (extras nest).
            data = {"action": action, "reward": reward, "next_obs": next_obs}
            if extras:
                data["extras"] = extras
        elif data is None:
            flat = {"action": action, "reward": reward}
            flat.update(self._obs_entries(next_obs, "next_obs", "next_obs"))
            if extras:
                flat["extras"] = extras
            data = unflatten(flat)
        checked = self._check(self._step, data, "add()")
        fields = {p: checked[a] for p, a in self._field_args}
        obs = {p: checked[a] for p, a in self._obs_args}
        return fields, obs

    def observations(self, obs: Any, count: int, argument: str) -> dict[str, np.ndarray]:
        """Check ``count`` observations (SignatureError as :meth:`step`); path to ``[count, ...]``
        arrays."""
        data = unflatten(self._obs_entries(obs, "obs", argument))
        return self._check(self._obs, data, argument, count)

    def final_observations(
        self, obs: dict[str, np.ndarray], final: Any, ended: np.ndarray
    ) -> dict[str, np.ndarray]:
        """``obs`` with ended environments' rows replaced by their final observations
        (InvalidArgumentError if ``final`` lacks a fitting one)."""
        out = {p: a.copy() for p, a in obs.items()}
        for i in ended.tolist():
            argument = f"info['final_obs'][{i}]" if self.batched else "info['final_obs']"
            try:
                value = final[i] if self.batched else final
            except (TypeError, IndexError, KeyError) as exc:
                raise InvalidArgumentError(
                    f"info['final_obs']={describe(final)} has no entry for environment {i}, "
                    "whose episode ended; pass the info of env.step unchanged"
                ) from exc
            data = unflatten(self._obs_entries(value, "obs", argument, batch=False))
            row = self._obs.check_row(data, argument, keep_floats=False)
            for p, a in row.items():
                out[p][i] = a
        return out

    def flags(self, value: Any, name: str) -> np.ndarray:
        """Check ``terminated`` / ``truncated``: one bool (or 0/1 int) per environment, else
        InvalidArgumentError (other ints are more likely another array passed by mistake)."""
        if type(value) is bool and not self.batched:
            return self._one_flag[value]
        arr = value if type(value) is np.ndarray else np.asarray(value)
        shape = self._flag_shape
        if arr.dtype is _BOOL and arr.shape == shape:
            return arr if self.batched else arr.reshape(1)
        if arr.shape != shape or arr.dtype.kind not in "biu":
            raise InvalidArgumentError(
                f"{name}={describe(value)} (shape {arr.shape}, dtype {arr.dtype}) must be "
                f"bools of shape {shape}, one per environment"
            )
        if arr.dtype.kind in "iu" and ((arr != 0) & (arr != 1)).any():
            raise InvalidArgumentError(
                f"{name}={describe(value)} holds ints other than 0 and 1; pass bools (or "
                "0/1), one per environment, as env.step returns them"
            )
        return arr.reshape(self.num_envs).astype(bool, copy=False)

    def env_ids(self, env_ids: Any) -> np.ndarray:
        """Check ``env_ids`` (``None``: all): distinct ints in ``[0, num_envs)``, as int64."""
        if env_ids is None:
            return np.arange(self.num_envs)
        arr = np.asarray(env_ids)
        ids = arr.reshape(-1)
        if (
            arr.ndim > 1
            or (ids.size and ids.dtype.kind not in "iu")
            or (ids.size and (ids.min() < 0 or ids.max() >= self.num_envs))
            or len(np.unique(ids)) != ids.size
        ):
            raise InvalidArgumentError(
                f"env_ids={describe(env_ids)} must be distinct ints in [0, {self.num_envs}) "
                "(or None for every environment)"
            )
        return ids.astype(np.int64)

    def _check(
        self, sig: Signature, data: Any, argument: str, count: int | None = None
    ) -> dict[str, np.ndarray]:
        """``sig``'s check of one batch (or one unbatched step), as ``[n, ...]`` arrays."""
        count = self.num_envs if count is None else count
        if not self.batched:
            return {p: a[None] for p, a in sig.check_row(data, argument, False).items()}
        try:
            arrays, n = sig.check_batch(data, argument)
        except SignatureError:
            self._name_short_batch(sig, data, argument, count)
            raise
        if n != count:
            raise InvalidArgumentError(
                f"{argument} holds {n} environments' values; expected {count} "
                f"(num_envs={self.num_envs})"
            )
        return arrays

    @staticmethod
    def _name_short_batch(sig: Signature, data: Any, argument: str, count: int) -> None:
        """Raise naming the first field whose leading axis is not ``count``, if any."""
        if isinstance(data, Mapping) and any(SEPARATOR in k for k in data):
            flat = data  # already flat (see step())
        else:
            try:
                flat = flatten(data) if isinstance(data, Mapping) else {}
            except InvalidArgumentError:
                return
        for path in sig.paths:
            shape = np.shape(flat[path]) if path in flat else None
            if shape is not None and shape[:1] != (count,):
                raise SignatureError(
                    f"{argument}[{path!r}] has shape {shape}; expected a leading axis of "
                    f"{count} environments"
                )

    def _obs_entries(
        self, value: Any, prefix: str, argument: str, batch: bool | None = None
    ) -> dict[str, Any]:
        """Flat entries of an observation (with ``stacked_obs``, newest frames)."""
        if not self.stacked_obs:
            return {prefix: value}
        batch = self.batched if batch is None else batch
        leaves = flatten(value) if isinstance(value, Mapping) else {"": value}
        out: dict[str, Any] = {}
        for p, v in leaves.items():
            name = prefix + (SEPARATOR + p if p else "")
            spec = self.signature.fields.get("obs" + (SEPARATOR + p if p else ""))
            arr = np.asarray(v)
            if spec is not None:
                if arr.ndim != len(spec.shape) + 1 + batch:
                    raise SignatureError(
                        f"{argument} field {name!r} has shape {arr.shape}; stacked_obs=True "
                        f"expects {'(batch, ' if batch else '('}k, *{spec.shape}) frame stacks"
                    )
                arr = arr[:, -1] if batch else arr[-1]
            out[name] = arr
        return out
