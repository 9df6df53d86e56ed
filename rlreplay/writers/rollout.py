"""On-policy rollouts from a vector env: one stored row per vector step, one item per rollout.

The A2C/PPO rollout buffer as an adder: every ``num_steps`` vector steps become one item
of ``num_steps + 1`` rows, every field ``[num_envs, ...]``, that a queue table hands to the
learner exactly once. See docs/adders.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlreplay.core.layout import ItemLayout, Window
from rlreplay.core.specs import FieldSpec, Signature, checked_extras, flatten, unflatten
from rlreplay.errors import ClosedError, InvalidArgumentError, SignatureError, check_count, describe
from rlreplay.writers.adder_options import adder_writer, first_table_span, writer_signature
from rlreplay.writers.autoreset import final_obs_source, mode_name

FLAGS = ("terminated", "truncated", "autoreset")
POLICY_VERSION = "policy_version"
RESERVED = ("obs", "action", "reward", *FLAGS, POLICY_VERSION)


def _per_env(prefix: str, spec: Any, num_envs: int) -> dict[str, FieldSpec]:
    """The fields of ``spec`` under ``prefix``, each with a leading ``num_envs`` axis."""
    fields = Signature({prefix: spec}).fields  # names the field of a bad spec
    return {p: FieldSpec((num_envs, *s.shape), s.dtype) for p, s in fields.items()}


class RolloutAdder:
    """Turns vector-env steps into one queue item per rollout of ``num_steps`` steps.

    A row (:meth:`signature`) holds all ``num_envs`` envs of one vector step; an item
    (:meth:`layout`) is ``num_steps + 1`` rows, the last holding the bootstrap observation.
    A row after an episode end has ``autoreset`` True and is no transition. On a writer
    timeout the step is kept and the next call hands the rest over: do not repeat the step.
    See docs/adders.md.

    Args:
        writer: a ``Table``, tables sharing a store, or a ``TrajectoryWriter``-like writer,
            with a signature from :meth:`signature`.
        num_steps: vector steps per rollout.
        num_envs: environments of the vector env (``None``: the signature's).
        timeout: seconds a writer call may wait for the queue (``None``: forever).
        autoreset_mode: ``"next_step"`` (the only one accepted).

    Raises:
        InvalidArgumentError: for a bad ``num_steps``/``num_envs``, a same-step
            ``autoreset_mode``, or a signature not made by :meth:`signature`.

    Example:
        >>> sig = RolloutAdder.signature(obs=((4,), "float32"), action="int64",
        ...                              num_envs=8, extras={"logp": "float32"})
        >>> table = Table.queue("rollouts", 4, signature=sig,             # doctest: +SKIP
        ...                     layout=RolloutAdder.layout(sig, num_steps=32))
        >>> adder = RolloutAdder(table, num_steps=32)                      # doctest: +SKIP
        >>> adder.reset(obs)                                               # doctest: +SKIP
        >>> adder.add(action, reward, next_obs, term, trunc, info,         # doctest: +SKIP
        ...           extras={"logp": logp, "policy_version": 0})
    """

    def __init__(
        self,
        writer: Any,
        num_steps: int,
        *,
        num_envs: int | None = None,
        timeout: float | None = None,
        autoreset_mode: Any = "next_step",
    ):
        num_steps = check_count(num_steps, "num_steps")
        if num_envs is not None:
            num_envs = check_count(num_envs, "num_envs")
        if mode_name(autoreset_mode) != "next_step":
            raise InvalidArgumentError(
                f"autoreset_mode={describe(autoreset_mode)}: RolloutAdder takes next-step "
                "autoreset only (a same-step env's final observations are in info, and a "
                "row per vector step has no place for them); make the env with gymnasium's "
                "default AutoresetMode.NEXT_STEP"
            )
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise InvalidArgumentError(f"timeout={describe(timeout)} must be seconds >= 0 or None")
        signature = writer_signature(writer)
        self.num_envs, self.obs_paths, self.extras = self._check_signature(signature, num_envs)
        span = first_table_span(writer)
        if span != num_steps + 1:
            raise InvalidArgumentError(
                f"the table's items span {span} rows, but a rollout of num_steps={num_steps} "
                f"is {num_steps + 1} (its bootstrap row included); build the table with "
                f"layout=RolloutAdder.layout(signature, {num_steps})"
            )
        self.writer = adder_writer(writer, num_steps + 1)
        self.table = self.writer.tables[0]
        self.num_steps = num_steps
        self.timeout = timeout
        self.signature = signature
        self._obs_signature = Signature(unflatten({p: signature[p] for p in self.obs_paths}))
        self._rows = self._new_rows()
        self._t = 0  # rows of the current rollout filled
        self._obs: dict[str, np.ndarray] | None = None  # where the next action is taken
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._pending: list[Callable[[float | None], Any]] = []  # a finished rollout's calls
        self._closing = False
        self._closed = False
        self.items_added = 0

    @staticmethod
    def signature(
        obs: Any,
        action: Any,
        num_envs: int,
        extras: Mapping[str, Any] | None = None,
        reward: Any = "float32",
    ) -> Signature:
        """Stored row signature: each field with a leading ``num_envs`` axis, and a scalar int64
        ``policy_version``.

        Args:
            obs: one env's observation spec (``(shape, dtype)``, a dtype or a gymnasium space).
            action: one environment's action spec.
            reward: one environment's reward spec (default ``"float32"``).
            num_envs: environments of the vector env.
            extras: per-env policy outputs, e.g. ``{"logp": "float32", "value": "float32"}``.

        Raises:
            InvalidArgumentError: for a bad ``num_envs`` or spec, or extras with reserved names.
        """
        num_envs = check_count(num_envs, "num_envs")
        extras = checked_extras(extras, RESERVED, "RolloutAdder")
        fields: dict[str, FieldSpec] = {}
        fields.update(_per_env("obs", obs, num_envs))
        fields.update(_per_env("action", action, num_envs))
        fields.update(_per_env("reward", reward, num_envs))
        for flag in FLAGS:
            fields[flag] = FieldSpec((num_envs,), "bool")
        for name, spec in extras.items():
            fields.update(_per_env(name, spec, num_envs))
        fields[POLICY_VERSION] = FieldSpec((), "int64")
        return Signature(unflatten(fields))

    @staticmethod
    def layout(signature: Signature | Mapping, num_steps: int) -> ItemLayout:
        """Item layout: every field as ``[B, num_steps + 1, num_envs, ...]``.

        Raises:
            InvalidArgumentError: for a bad ``num_steps``.
        """
        length = check_count(num_steps, "num_steps") + 1
        sig = Signature(signature)
        return ItemLayout({p: Window(p, 0, length) for p in sig.paths}, sig)

    @staticmethod
    def _check_signature(
        sig: Signature, num_envs: int | None
    ) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
        """``(num_envs, obs paths, extra paths)`` of a :meth:`signature` signature.

        Raises:
            InvalidArgumentError: naming what differs from one :meth:`signature` makes.
        """
        fix = (
            "; build the table with RolloutAdder.signature(obs, action, num_envs, extras) "
            "(num_envs must be the vector env's)"
        )
        spec = sig[POLICY_VERSION] if POLICY_VERSION in sig else None  # noqa: SIM401
        if spec is None or spec.shape != () or spec.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"the signature {sig} has no integer scalar {POLICY_VERSION!r}" + fix
            )
        missing = [p for p in ("obs", "action", "reward", *FLAGS) if not _has(sig, p)]
        if missing:
            raise InvalidArgumentError(f"the signature {sig} lacks the fields {missing}" + fix)
        n = num_envs if num_envs is not None else (sig["terminated"].shape or (0,))[0]
        for p, s in sig.fields.items():
            if p != POLICY_VERSION and s.shape[:1] != (n,):
                raise InvalidArgumentError(
                    f"the signature's field {p!r} is {s.dtype}{list(s.shape)}, not per env "
                    f"[{n}, ...]" + fix
                )
        for flag in FLAGS:
            if sig[flag] != FieldSpec((n,), "bool"):
                raise InvalidArgumentError(f"the signature's {flag!r} is not bool[{n}]" + fix)
        obs = tuple(p for p in sig.paths if p == "obs" or p.startswith("obs/"))
        fixed = (*obs, "action", "reward", *FLAGS, POLICY_VERSION)
        return n, obs, tuple(p for p in sig.paths if p not in fixed)

    def _new_rows(self) -> dict[str, np.ndarray]:
        return {
            p: np.zeros((self.num_steps + 1, *s.shape), s.dtype)
            for p, s in self.signature.fields.items()
        }

    def _check_obs(self, obs: Any, argument: str) -> dict[str, np.ndarray]:
        """``obs`` checked and copied as ``{path: array}``."""
        row = self._obs_signature.check_row({"obs": obs}, argument, keep_floats=False)
        return {p: np.array(v, dtype=self.signature[p].dtype) for p, v in row.items()}

    def _check_open(self, call: str) -> None:
        if self._closing:
            raise ClosedError(
                f"{call}() after close(): the adder no longer writes (its steps would be "
                "lost); create a new adder"
            )

    def reset(self, obs: Any) -> None:
        """Start every environment's episode at ``obs`` and a new rollout (dropping the unfinished).

        Raises:
            ClosedError: after :meth:`close`.
            SignatureError: if ``obs`` does not fit ``[num_envs, *obs_shape]``; nothing changes.
        """
        self._check_open("reset")
        self._obs = self._check_obs(obs, "reset() obs")
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._t = 0

    def add(
        self,
        action: Any,
        reward: Any,
        next_obs: Any,
        terminated: Any,
        truncated: Any,
        info: Any = None,
        extras: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one vector step; every ``num_steps`` steps write the rollout's item.

        Args:
            action: the actions taken (``[num_envs, ...]``).
            reward: the rewards returned (``[num_envs]``).
            next_obs: the observations returned (``[num_envs, ...]``).
            terminated: the ``terminated`` flags (``[num_envs]``).
            truncated: the ``truncated`` flags (``[num_envs]``).
            info: the step's ``info`` (to detect the autoreset mode).
            extras: the signature's extras (``[num_envs, ...]`` each) and one ``policy_version``.

        Raises:
            ClosedError: after :meth:`close`.
            InvalidArgumentError: before :meth:`reset`, for a missing or mixed ``policy_version``,
                or a same-step env.
            SignatureError: if a value is missing or does not fit its column; nothing is recorded.
            ReplayTimeoutError: if the queue stayed full for ``timeout``; the step is recorded.
        """
        self._check_open("add")
        if self._obs is None:
            raise InvalidArgumentError("add() before reset(obs); call reset first")
        if extras is not None and not isinstance(extras, Mapping):
            raise InvalidArgumentError(f"extras={describe(extras)} must be a dict or None")
        extras = flatten(extras or {})
        version = extras.pop(POLICY_VERSION, None)
        if version is None:
            raise InvalidArgumentError(
                f"extras lack {POLICY_VERSION!r}: give the version of the weights that "
                "chose the actions (the runtime's actor adds it)"
            )
        versions = np.unique(np.asarray(version))
        if versions.size != 1 or versions.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"extras[{POLICY_VERSION!r}]={describe(version)} must be one integer version "
                "(or one per env, all equal): one policy call acts for every environment"
            )
        if extras.keys() != set(self.extras):
            raise SignatureError(
                f"add() extras hold {sorted(extras)} besides {POLICY_VERSION!r}; the "
                f"signature's extras are exactly {list(self.extras)}: missing "
                f"{[p for p in self.extras if p not in extras]}, unknown "
                f"{[p for p in extras if p not in self.extras]}"
            )
        row = {
            **self._obs,
            "action": action,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "autoreset": self._autoreset,
            **extras,
            POLICY_VERSION: versions[0],
        }
        checked = self.signature.check_row(row, "add()", keep_floats=False)
        next_checked = self._check_obs(next_obs, "add() next_obs")
        ended = np.logical_or(checked["terminated"], checked["truncated"])
        final_obs_source("next_step", info, bool(ended.any()))  # refuses a same-step env
        t = self._t
        for p, v in checked.items():
            self._rows[p][t] = v
        self._obs = next_checked
        self._autoreset = ended
        self._t = t + 1
        if self._t == self.num_steps:
            self._finish_rollout()
        if self._pending:  # this rollout's writes, or an earlier one's the queue refused
            self.hand_over(self.timeout)

    def _finish_rollout(self) -> None:
        """Complete the rollout with the bootstrap row and queue its writer calls."""
        rows, n = self._rows, self.num_steps
        for p in rows:
            rows[p][n] = 0
        for p in self.obs_paths:
            rows[p][n] = self._obs[p]
        rows[POLICY_VERSION][n] = rows[POLICY_VERSION][n - 1]
        self._rows = self._new_rows()
        self._t = 0
        writer, table, start = self.writer, self.table, -(n + 1)
        self._pending += [
            lambda t: writer.append_batch(rows, timeout=t),
            lambda t: writer.create_items(table, starts=[start], timeout=t),
            lambda t: writer.end_episode(),
        ]
        self.items_added += 1

    def hand_over(self, timeout: float | None = None) -> None:
        """Hand a finished rollout's remaining writer calls over, waiting only for room.

        Raises:
            ReplayTimeoutError: if the queue stayed full for ``timeout`` seconds; call again later.
        """
        if self._closed:
            return
        while self._pending:
            self._pending[0](timeout)
            self._pending.pop(0)

    def flush(self, timeout: float | None = None) -> None:
        """Hand a finished rollout's remaining writer calls over, then flush the writer.

        Raises:
            ReplayTimeoutError: if the queue stayed full for ``timeout`` seconds; call again later.
        """
        if self._closed:
            return
        self.hand_over(timeout)
        self.writer.flush(timeout)
        if self._closing:
            self.writer.close()
            self._closed = True

    def close(self) -> None:
        """Flush, then close the writer; an unfinished rollout is dropped.

        Raises:
            ReplayTimeoutError: if the flush timed out; the writer closes at the next :meth:`flush`.
        """
        self._closing = True
        self.flush(self.timeout)


def _has(sig: Signature, name: str) -> bool:
    """Whether ``sig`` has the field ``name`` or fields under it."""
    return name in sig or any(p.startswith(name + "/") for p in sig.paths)
