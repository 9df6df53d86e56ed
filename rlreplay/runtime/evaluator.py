"""The evaluator: a process of its own that scores published weights.

Evaluation holds the interpreter lock, so it runs apart from the learner;
``evaluate_params`` is pickled into the process and must be defined at module level.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import pickle
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlreplay.errors import ComponentFailedError, InvalidArgumentError, ReplayTimeoutError, describe

_POLL_S = 0.1  # how often a waiting call checks that the process is alive


def _serve(evaluate_params: Callable[[Mapping[str, np.ndarray]], float], conn: Any) -> None:
    """Body of the evaluator process: score each params received until ``None`` comes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops it through the pipe
    while True:
        try:
            params = conn.recv()
        except EOFError:  # the driver is gone
            return
        if params is None:
            return
        try:
            conn.send(("ok", float(evaluate_params(params))))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class EvaluatorProcess:
    """Scores params with ``evaluate_params`` in a process of its own.

    Args:
        evaluate_params: ``params -> mean return``, picklable (defined at module level).
        timeout_s: seconds one evaluation may take before the call raises.

    Raises:
        InvalidArgumentError: for a non-callable or unpicklable ``evaluate_params``, or a
            ``timeout_s`` that is not a positive number.

    Example:
        >>> score20 = functools.partial(score, episodes=20)  # score: module level
        >>> with EvaluatorProcess(score20) as evaluator:  # doctest: +SKIP
        ...     mean_return = evaluator(params)
    """

    def __init__(
        self,
        evaluate_params: Callable[[Mapping[str, np.ndarray]], float],
        timeout_s: float = 600.0,
    ):
        if not callable(evaluate_params):
            raise InvalidArgumentError(
                f"evaluate_params={describe(evaluate_params)} must be a callable params -> return"
            )
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            timeout_s > 0
        ):
            raise InvalidArgumentError(f"timeout_s={describe(timeout_s)} must be a number > 0")
        try:
            pickle.dumps(evaluate_params)
        except Exception as exc:
            raise InvalidArgumentError(
                f"evaluate_params={describe(evaluate_params)} cannot be pickled ({exc}), and "
                "evaluations run in a process of their own; define it at module level (a "
                "function, a functools.partial of one, or an instance of a module-level "
                "class), not as a lambda or a local function"
            ) from exc
        self.timeout_s = float(timeout_s)
        self.scores = 0  # evaluations answered, error or not
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(evaluate_params, child), name="rlreplay-evaluator", daemon=True
        )
        self._proc.start()
        child.close()
        self._closer = weakref.finalize(self, _close, self._conn, self._proc)

    def __call__(self, params: Mapping[str, np.ndarray]) -> float:
        """The score of ``params`` from the evaluator process (blocks up to ``timeout_s``).

        Raises:
            ComponentFailedError: if ``evaluate_params`` raised (traceback in the message) or the
                process died.
            ReplayTimeoutError: if no score came within ``timeout_s``; the process is stopped
                and later calls raise ComponentFailedError (make a new EvaluatorProcess).
        """
        if not self._proc.is_alive():
            raise ComponentFailedError("evaluator", self._ended())
        try:
            self._conn.send(dict(params))
        except (BrokenPipeError, OSError):
            raise ComponentFailedError("evaluator", self._ended()) from None
        end = time.monotonic() + self.timeout_s
        try:
            while not self._conn.poll(_POLL_S):
                if not self._proc.is_alive():
                    raise ComponentFailedError("evaluator", self._ended())
                if time.monotonic() > end:
                    self.close()
                    raise ReplayTimeoutError(
                        f"an evaluation took more than timeout_s={self.timeout_s:g}s; the "
                        "evaluator was stopped (give a larger timeout_s, or fewer episodes)"
                    )
            kind, value = self._conn.recv()
        except (EOFError, ConnectionError):  # the process died with the pipe
            raise ComponentFailedError("evaluator", self._ended()) from None
        self.scores += 1
        if kind == "error":
            last = value.strip().splitlines()[-1] if value.strip() else "no message"
            raise ComponentFailedError("evaluator", f"evaluate_params raised {last}\n{value}")
        return value

    def _ended(self) -> str:
        self._proc.join(0.5)
        code = self._proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        hint = (
            "; an evaluator that ends before its first score often means the script starting "
            "it lacks an `if __name__ == \"__main__\":` guard, or evaluate_params was defined "
            "in a notebook or a script read from stdin: the process imports the main module "
            "to load it (define evaluate_params in a module file)"
            if self.scores == 0 and code is not None and code > 0 else ""
        )
        return f"its process (pid {self._proc.pid}) ended ({how}){hint}"

    def close(self) -> None:
        """Stop the process (it finishes the evaluation under way for at most 1 s)."""
        self._closer()

    def __enter__(self) -> EvaluatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(conn: Any, proc: Any) -> None:
    with contextlib.suppress(OSError):  # the process is gone already
        conn.send(None)
    proc.join(1.0)
    if proc.is_alive():
        proc.kill()
        proc.join(1.0)
    conn.close()
