"""The options every stream adder takes, checked and sized before any part is built.

:class:`~rlreplay.writers.stream.StreamAdder` and its subclasses share one set of
options (environments per call, autoreset mode, priority of new items, chunk length,
timeout, hand-over period, sequence tables). They are checked here, all before the
adder builds its writer, buffers or hand-over, so a bad option changes nothing, and
turned into the sizes those parts are built with (:class:`AdderOptions`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.table_checks import check_timeout
from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.writers.autoreset import mode_name
from rlreplay.writers.hand_over import check_every
from rlreplay.writers.sequence_items import SequenceItems

# Rows a chunk holds at most by default (fewer when the store is smaller).
DEFAULT_CHUNK_LENGTH = 64


def check_priority(priority: Any) -> None:
    """Check the priority an adder gives new items: a number >= 0, or ``None``.

    Raises:
        InvalidArgumentError: for anything else.
    """
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, float, np.number)):
        raise InvalidArgumentError(
            f"priority={describe(priority)} must be a number >= 0, or None for each table's default"
        )
    check_priorities(priority, 1, "priority")


def sequence_rules(sequence_tables: Mapping[Any, Any] | None) -> list[tuple[Any, SequenceItems]]:
    """``sequence_tables`` as ``(table, rule)`` pairs, each rule the adder's own copy (a
    rule holds per-environment positions, so adders never share one).

    Raises:
        InvalidArgumentError: for a value that is not a :class:`SequenceItems`.
    """
    rules = [(t, copy.copy(r)) for t, r in (sequence_tables or {}).items()]
    for _, rule in rules:
        if not isinstance(rule, SequenceItems):
            raise InvalidArgumentError(
                f"sequence_tables values must be SequenceItems(length, period, ...), got "
                f"{describe(rule)}"
            )
    return rules


@dataclass(frozen=True)
class AdderOptions:
    """An adder's options once checked, and the row capacity they imply.

    Attributes:
        num_envs: environments per call (1 without a batch axis).
        batched: whether inputs carry a batch axis (``num_envs`` was given).
        mode: the autoreset mode's name.
        chunk_length: rows buffered per environment before they are handed over.
        priority: priority of new items (``None``: each table's default).
        timeout: seconds each writer call may wait (``None``: no limit).
        every: adder calls completed rows are staged for before they are handed over.
        capacity: rows each environment's buffer holds: the rows an item may reach back
            to (``fixed``) plus a chunk.
    """

    num_envs: int
    batched: bool
    mode: str
    chunk_length: int
    priority: float | None
    timeout: float | None
    every: int
    capacity: int

    @classmethod
    def check(
        cls,
        *,
        fixed: int,
        store_capacity: int | None,
        num_envs: Any,
        autoreset_mode: Any,
        priority: Any,
        chunk_length: Any,
        timeout: Any,
        hand_over_every: Any,
    ) -> AdderOptions:
        """The options checked, ``chunk_length`` defaulted to what the store leaves.

        Args:
            fixed: rows a buffer needs besides a chunk (items' span, lag, padding).
            store_capacity: the store's rows when it is known locally (``None``: remote).
            num_envs, autoreset_mode, priority, chunk_length, timeout, hand_over_every:
                as :class:`~rlreplay.writers.stream.StreamAdder` takes them.

        Raises:
            InvalidArgumentError: for the first option that is out of its range.
        """
        if chunk_length is None:
            room = DEFAULT_CHUNK_LENGTH if store_capacity is None else store_capacity - fixed
            chunk_length = max(1, min(DEFAULT_CHUNK_LENGTH, room))
        if not isinstance(chunk_length, int) or chunk_length < 1:
            raise InvalidArgumentError(f"chunk_length={describe(chunk_length)} must be an int >= 1")
        if num_envs is not None and (not isinstance(num_envs, int) or num_envs < 1):
            raise InvalidArgumentError(
                f"num_envs={describe(num_envs)} must be an int >= 1, or None for one env "
                "without a batch axis"
            )
        check_priority(priority)
        timeout = check_timeout(timeout)
        every = check_every(hand_over_every, num_envs is not None)
        return cls(
            num_envs=num_envs or 1,
            batched=num_envs is not None,
            mode=mode_name(autoreset_mode),
            chunk_length=chunk_length,
            priority=priority,
            timeout=timeout,
            every=every,
            capacity=fixed + chunk_length,
        )
