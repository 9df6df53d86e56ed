"""Learner-side batch iteration: background prefetching and a single-thread loop helper.

:class:`ReplayIterator` samples a table in a background thread, ``prefetch`` batches
ready, as numpy, torch or jax (imported only when asked for). :func:`learn_while_can_sample`
learns only while the rate limiter allows a sample now, so it never blocks.
"""

from __future__ import annotations

import importlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    check_count,
    check_timeout,
    describe,
)

OUTPUTS = ("numpy", "torch", "jax")
_POLL_S = 0.05


class _Failure:
    """An exception raised in the background thread, handed to the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


def _import(output: str) -> Any:
    """The framework module ``output`` names.

    Raises:
        InvalidArgumentError: if it is not installed.
    """
    try:
        return importlib.import_module(output)
    except ImportError as exc:
        raise InvalidArgumentError(
            f"output={output!r} needs {output}, which is not installed ({exc}); install it "
            f"(python -m pip install {output}) or choose output='numpy'"
        ) from exc


def _torch_device(torch: Any, device: Any, pin_memory: bool) -> Any:
    """``device`` as a torch device usable here (None: the CPU).

    Raises:
        InvalidArgumentError: for an unusable device, or ``pin_memory=True`` without one.
    """
    dev = None
    if device is not None:
        try:
            dev = torch.device(device)
            torch.empty(0, device=dev)  # fails here, not in the sampling thread
        except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"device={describe(device)} cannot hold torch tensors here ({exc}); leave "
                "device out for CPU tensors, or install a torch build for that device"
            ) from None
    if pin_memory:
        try:
            torch.empty(1).pin_memory()
        except RuntimeError as exc:
            raise InvalidArgumentError(
                f"pin_memory=True needs an accelerator (CUDA device) to pin memory for, and "
                f"torch has none here ({exc}); leave pin_memory out on a CPU-only machine"
            ) from None
    return dev


def _converter(output: str, device: Any, pin_memory: bool) -> Callable[[np.ndarray], Any]:
    """The function converting one sampled array to ``output``'s type on ``device``."""
    if output == "numpy":
        return lambda a: a
    if output == "torch":
        torch = _import("torch")
        dev = _torch_device(torch, device, pin_memory)

        def to_torch(a: np.ndarray) -> Any:
            try:
                t = torch.from_numpy(a)  # shares memory, strided views included
            except ValueError:  # negative strides: torch needs a copy
                t = torch.from_numpy(np.ascontiguousarray(a))
            if pin_memory:
                t = t.pin_memory()
            if dev is not None and dev != t.device:
                t = t.to(dev, non_blocking=pin_memory)
            return t

        return to_torch
    jax = _import("jax")
    dev = device

    def to_jax(a: np.ndarray) -> Any:
        return jax.device_put(a, dev) if dev is not None else jax.numpy.asarray(a)

    return to_jax


def batch_output(
    output: str = "numpy", device: Any = None, pin_memory: bool = False
) -> Callable[[Sample], Sample]:
    """The conversion every sample iterator applies to its batches' data arrays (info stays numpy).

    Args:
        output: ``"numpy"`` (no conversion), ``"torch"`` or ``"jax"``.
        device: torch or jax device for the arrays (default: CPU / jax default).
        pin_memory: pin torch host memory before moving to ``device``.

    Raises:
        InvalidArgumentError: for an unknown or uninstalled ``output``, an unusable
            ``device``, or ``pin_memory=True`` without torch or an accelerator.
    """
    if not isinstance(output, str) or output not in OUTPUTS:
        raise InvalidArgumentError(
            f"output={describe(output)} is unknown; choose one of {OUTPUTS}"
        )
    if not isinstance(pin_memory, bool):
        raise InvalidArgumentError(f"pin_memory={describe(pin_memory)} must be a bool")
    if pin_memory and output != "torch":
        raise InvalidArgumentError("pin_memory=True needs output='torch'")
    convert = _converter(output, device, pin_memory)
    if output == "numpy":
        return _same

    def converted(batch: Sample) -> Sample:
        return Sample({k: convert(v) for k, v in batch.data.items()}, batch.info)

    return converted


def _same(batch: Sample) -> Sample:
    return batch


class ReplayIterator:
    """Iterates over batches sampled from a table, ``prefetch`` of them kept ready.

    Items are :class:`~rlreplay.core.sample.Sample` s, ``data`` converted to ``output``. Close
    it (or use ``with``): its thread keeps ``prefetch`` batches sampled, which counts against
    the rate limiter.

    Args:
        table: a :class:`Table` (or anything with ``sample(batch_size, timeout=)``).
        batch_size: items per batch.
        prefetch: batches kept ready ahead of the learner (``>= 1``).
        timeout: seconds :meth:`__next__` waits for a batch (``None``: without limit).
        output: ``"numpy"``, ``"torch"`` or ``"jax"``.
        device: torch or jax device for the arrays (default: CPU / jax default).
        pin_memory: pin torch host memory before moving to ``device``.
        max_batches: stop after this many batches (``None``: until closed).

    Raises:
        InvalidArgumentError: for a bad argument (checked here, not in the thread).
        ReplayTimeoutError: from ``next()`` when no batch arrived within ``timeout``.
        ReplayError: the sampling thread's error, re-raised by ``next()`` (a closed table
            ends iteration instead).

    Example:
        >>> with ReplayIterator(table, 256, prefetch=2, output="torch") as it:  # doctest: +SKIP
        ...     for batch in it:
        ...         loss = learn(batch.data["obs"], batch.data["reward"])
    """

    def __init__(
        self,
        table: Any,
        batch_size: int,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        output: str = "numpy",
        device: Any = None,
        pin_memory: bool = False,
        max_batches: int | None = None,
    ):
        convert = batch_output(output, device, pin_memory)
        if not callable(getattr(table, "sample", None)):
            raise InvalidArgumentError(
                f"table={describe(table)} has no sample(batch_size, timeout=) method; give a "
                "Table (or a client's remote table, client.table(name))"
            )
        batch_size = check_count(batch_size, "batch_size", "items per batch")
        prefetch = check_count(prefetch, "prefetch")
        timeout = check_timeout(timeout)
        if max_batches is not None:
            max_batches = check_count(max_batches, "max_batches", "or None", minimum=0)
        self.table = table
        self.batch_size = int(batch_size)
        self.timeout = timeout
        self.max_batches = max_batches
        self._convert = convert
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._done = object()
        self.wait_s = 0.0  # time the learner spent waiting in next()
        self.batches = 0
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="rlreplay-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        produced = 0
        try:
            while not self._stop.is_set():
                if self.max_batches is not None and produced >= self.max_batches:
                    break
                try:
                    batch = self.table.sample(self.batch_size, timeout=_POLL_S)
                except RateLimiterTimeoutError:
                    continue  # poll again so close() is noticed
                self._put(self._convert(batch))
                produced += 1
        except ClosedError:
            pass
        except BaseException as error:  # handed to the learner thread
            self._put(_Failure(error))
            return
        self._put(self._done)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def __iter__(self) -> ReplayIterator:
        return self

    def __next__(self) -> Sample:
        start = time.monotonic()
        end = None if self.timeout is None else start + self.timeout
        try:
            while True:  # in slices, so that close() from another thread ends the wait
                if self._finished:
                    raise StopIteration
                left = _POLL_S if end is None else min(_POLL_S, end - time.monotonic())
                try:
                    item = self._queue.get(timeout=max(left, 0.0))
                    break
                except queue.Empty:
                    if end is not None and time.monotonic() >= end:
                        raise ReplayTimeoutError(
                            f"no batch of {self.batch_size} arrived within timeout="
                            f"{self.timeout}s; the table may be empty or its rate limiter "
                            "blocks sampling (insert more data)"
                        ) from None
        finally:
            self.wait_s += time.monotonic() - start
        if item is self._done:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.error
        self.batches += 1
        return item

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting up to ``timeout`` s); a waiting :meth:`__next__` stops too."""
        self._stop.set()
        self._finished = True
        self._thread.join(timeout)

    def __enter__(self) -> ReplayIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()


def learn_while_can_sample(
    table: Any,
    batch_size: int,
    learn: Callable[[Sample], Any],
    max_batches: int,
) -> int:
    """Sample and learn while the table allows a sample now; never blocks.

    For the single-threaded loop ``act -> add -> learn_while_can_sample``.

    Args:
        table: the table to sample.
        batch_size: items per batch.
        learn: called with each :class:`Sample`.
        max_batches: most batches this call takes (``>= 0``).

    Returns:
        The number of batches learned from.

    Raises:
        InvalidArgumentError: for a bad ``max_batches``, a non-callable ``learn``, or a
            ``batch_size`` the table refuses (nothing is sampled).
    """
    if not callable(learn):
        raise InvalidArgumentError(
            f"learn={describe(learn)} must be callable: it is called with each Sample"
        )
    max_batches = check_count(
        max_batches,
        "max_batches",
        "it bounds the loop when the rate limiter always allows sampling",
        minimum=0,
    )
    done = 0
    while done < max_batches and table.can_sample(batch_size):
        try:
            batch = table.sample(batch_size, timeout=_POLL_S)
        except RateLimiterTimeoutError:
            break  # another thread consumed the allowance between the check and the sample
        learn(batch)
        done += 1
    return done
