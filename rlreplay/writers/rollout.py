"""On-policy rollouts from a vector env: one stored row per vector step, one item per rollout.

The rollout buffer of A2C/PPO (CleanRL's, SB3's ``RolloutBuffer``, TorchRL's collector
output) as an adder: every ``num_steps`` vector steps become one item of ``num_steps + 1``
rows, every field ``[num_envs, ...]``, that a queue table (``Table.queue`` or the runtime's
``ReplaySpec(on_policy=True)``) hands to the learner exactly once.
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
    """The fields of ``spec`` (a spec or a nested dict of them) under ``prefix``, each
    with a leading ``num_envs`` axis."""
    fields = Signature({prefix: spec}).fields  # names the field of a bad spec
    return {p: FieldSpec((num_envs, *s.shape), s.dtype) for p, s in fields.items()}


class RolloutAdder:
    """Turns vector-env steps into one queue item per rollout of ``num_steps`` steps.

    Stored rows (:meth:`signature`): one per *vector* step, every field but
    ``policy_version`` holding all ``num_envs`` environments: ``obs`` (the observation
    the action was taken in), ``action``, ``reward``, ``terminated``, ``truncated``,
    ``autoreset``, the per-env extras (e.g. the acting policy's ``logp`` and ``value``)
    and ``policy_version`` (one per row: one policy call acts for every environment).

    Items (:meth:`layout`): a rollout is ``num_steps + 1`` rows, served as
    ``[B, num_steps + 1, num_envs, ...]`` per field. The last row holds the observation
    after the rollout's last step (to bootstrap from) and zeros in the other fields
    (its ``policy_version`` repeats the last step's). Rows are buffered and written with
    one ``append_batch``, one ``create_items`` and ``end_episode`` when the rollout is
    complete, so every rollout is exactly one item whatever the episodes do: an actor
    whose weight sync period is ``num_steps * num_envs`` env steps adds one item per
    period. The bootstrap observation is stored twice: as the last row of one rollout
    and the first row of the next.

    Episode ends (gymnasium's default next-step autoreset): the step that ends an
    episode returns the true final observation, so after a truncation the next row's
    ``obs`` is the one to bootstrap from; the following step ignores its action and
    returns the reset observation: its row has ``autoreset`` True and is no transition
    (no advantage, no loss; the advantage recursion does not run across it), also when
    it is the first row of the next rollout. Same-step autoreset is refused: its final
    observations live in ``info``, and a row per vector step has no place for them.

    Calls: ``reset(obs)`` (after ``envs.reset()``), ``add(...)`` per vector step,
    ``hand_over(timeout)``, ``flush(timeout)``, ``close()``. ``reset`` starts a new
    rollout: the steps of an unfinished one are dropped (they are no item), as are those
    :meth:`close` finds.

    Timeouts: when a writer call waits longer than ``timeout`` (the queue is full), the
    call raises ``ReplayTimeoutError`` with its step recorded; the rollout's remaining
    writer calls are handed over, in order, by the next ``add``, ``hand_over`` or
    ``flush``. Go on with the next step (do not repeat it): nothing is lost or written
    twice.

    Args:
        writer: a ``Table``, a list of tables sharing a store, or a writer with the
            ``TrajectoryWriter`` interface (a remote one in the processes backend); its
            signature must come from :meth:`signature`.
        num_steps: vector steps per rollout.
        num_envs: environments of the vector env (``None``: the signature's).
        timeout: seconds a writer call may wait for the queue (``None``: forever).
        autoreset_mode: ``"next_step"`` (gymnasium's default; the only one accepted).

    Raises:
        InvalidArgumentError: for a bad ``num_steps``/``num_envs``, a same-step
            ``autoreset_mode``, or a signature that :meth:`signature` did not make for
            ``num_envs`` environments.

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

    # ---------------------------------------------------------- construction
    @staticmethod
    def signature(
        obs: Any,
        action: Any,
        num_envs: int,
        extras: Mapping[str, Any] | None = None,
        reward: Any = "float32",
    ) -> Signature:
        """Stored row signature: ``obs`` (a spec, or a nested dict of specs for dict
        observations), ``action``, ``reward``, ``terminated``, ``truncated``,
        ``autoreset`` and ``extras``, each with a leading ``num_envs`` axis, and
        ``policy_version`` (int64, one per row).

        Args:
            obs: one environment's observation spec (``(shape, dtype)``, a dtype or a
                gymnasium space such as ``env.single_observation_space``; a ``Dict``
                space nests).
            action: one environment's action spec (``(shape, dtype)``, a dtype or a
                gymnasium space).
            reward: one environment's reward spec (default ``"float32"``).
            num_envs: environments of the vector env.
            extras: per-env fields the policy gives with each action, e.g.
                ``{"logp": "float32", "value": "float32"}``.

        Raises:
            InvalidArgumentError: for a bad ``num_envs`` or spec, or extras that use the
                names the adder fills itself.
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
        """Item layout: every field as ``[B, num_steps + 1, num_envs, ...]`` (the
        rollout's rows plus the bootstrap row).

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

    # ---------------------------------------------------------------- calls
    def _check_obs(self, obs: Any, argument: str) -> dict[str, np.ndarray]:
        """``obs`` (an array, or a dict for dict observations) as checked, copied
        ``{path: array}``."""
        row = self._obs_signature.check_row({"obs": obs}, argument, keep_floats=False)
        return {p: np.array(v, dtype=self.signature[p].dtype) for p, v in row.items()}

    def _check_open(self, call: str) -> None:
        if self._closing:
            raise ClosedError(
                f"{call}() after close(): the adder no longer writes (its steps would be "
                "lost); create a new adder"
            )

    def reset(self, obs: Any) -> None:
        """Start every environment's episode at ``obs`` (after ``envs.reset()``) and a
        new rollout (the steps of an unfinished one are dropped).

        Raises:
            ClosedError: after :meth:`close`.
            SignatureError: if ``obs`` does not fit the signature's ``obs``
                (``[num_envs, *obs_shape]``); nothing changes then.
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
            action: the actions ``envs.step`` took (``[num_envs, ...]``).
            reward: the rewards it returned (``[num_envs]``).
            next_obs: the observations it returned (``[num_envs, ...]``).
            terminated: its ``terminated`` flags (``[num_envs]``).
            truncated: its ``truncated`` flags (``[num_envs]``).
            info: its ``info`` dict (for the autoreset mode).
            extras: the signature's extras (``[num_envs, ...]`` each, from the policy)
                and ``policy_version`` (one version, or one per env, all equal).

        Raises:
            ClosedError: after :meth:`close`.
            InvalidArgumentError: if :meth:`reset` was not called, ``policy_version`` is
                missing or not one version, or ``info`` shows a same-step env.
            SignatureError: if a value is missing or does not fit its column (a shape,
                a float action for an int column); nothing is recorded then.
            ReplayTimeoutError: if the writer waited ``timeout`` for the queue; the step
                is recorded and the next :meth:`add` or :meth:`flush` hands over the rest.
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
        """Hand a finished rollout's remaining writer calls over, waiting only for the
        room the writer needs to take them (not until they are stored: :meth:`flush`).

        Raises:
            ReplayTimeoutError: if the queue stayed full for ``timeout`` seconds; call
                again later (nothing is written twice).
        """
        if self._closed:
            return
        while self._pending:
            self._pending[0](timeout)
            self._pending.pop(0)

    def flush(self, timeout: float | None = None) -> None:
        """Hand a finished rollout's remaining writer calls over, then flush the writer.

        Raises:
            ReplayTimeoutError: if the queue stayed full for ``timeout`` seconds; call
                again later (nothing is written twice).
        """
        if self._closed:
            return
        self.hand_over(timeout)
        self.writer.flush(timeout)
        if self._closing:
            self.writer.close()
            self._closed = True

    def close(self) -> None:
        """Flush, then close the writer; an unfinished rollout is dropped (it is no item).

        Raises:
            ReplayTimeoutError: if the flush timed out; the writer closes at the
                :meth:`flush` that completes.
        """
        self._closing = True
        self.flush(self.timeout)


def _has(sig: Signature, name: str) -> bool:
    """Whether ``sig`` has the field ``name`` or fields under ``name/``."""
    return name in sig or any(p.startswith(name + "/") for p in sig.paths)
