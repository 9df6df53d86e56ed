"""Where actors run: threads of this process, or processes talking to a replay server.

Both have the same small interface: ``start()``, ``counters()``, ``done()``, ``check()``
(raises :class:`~rlreplay.errors.ComponentFailedError`) and ``stop(timeout)``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from typing import Any

import numpy as np

from rlreplay.errors import ClosedError, ComponentFailedError, InvalidArgumentError
from rlreplay.runtime.actor import ENV_STEPS, FINISHED, NUM_COUNTERS
from rlreplay.runtime.environment_loop import ActorRecipe
from rlreplay.runtime.stop_flag import StopFlag

# Steps of history a remote writer keeps for the adder at most (long rollouts fit).
_MAX_HISTORY = 4096


def actor_writer(client: Any, table: str, writers_per_store: int, **options: Any) -> Any:
    """The remote writer an actor writes through (``options``: e.g. a sharded client's ``shard``).

    The writers of one store share half of it for retained steps. One chunk may await
    acknowledgement while the next fills, each at most half of what the limiter admits, so
    env steps run at most two chunks ahead of the table."""
    described = client.describe(table)
    capacity, span = described["store_capacity"], described["span"]
    share = (capacity // 2) // writers_per_store
    history = max(span, min(_MAX_HISTORY, share))
    return client.trajectory_writer(table, history=history, max_in_flight=1, **options)


class ThreadActors:
    """Actors as threads writing straight into the table."""

    def __init__(self, recipe: ActorRecipe, table: Any, weights: Any, stop: threading.Event):
        self.recipe = recipe
        self.table = table
        self.weights = weights
        self._stop = stop
        n = recipe.config.num_actors
        self._counters = np.zeros((n, NUM_COUNTERS))
        self._threads: list[threading.Thread] = []
        self._errors: dict[int, BaseException] = {}

    def start(self) -> None:
        for i in range(self.recipe.config.num_actors):
            thread = threading.Thread(
                target=self._run, args=(i,), name=f"rlreplay-actor-{i}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _run(self, index: int) -> None:
        try:
            actor = self.recipe.build(
                index, self.table, self.weights, self._counters[index], self._stop
            )
            actor.run()
        except ClosedError:
            if not self._stop.is_set():
                self._errors[index] = ClosedError("the table or weights closed under the actor")
        except BaseException as error:  # reported by check() in the driver
            self._errors[index] = error

    def counters(self) -> np.ndarray:
        return self._counters

    def done(self) -> bool:
        return bool(self._counters[:, FINISHED].all())

    def check(self) -> None:
        for index, error in sorted(list(self._errors.items())):
            raise ComponentFailedError(
                f"actor {index}", f"{type(error).__name__}: {error}"
            ) from error

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every actor to stop and wait for them, ``timeout`` seconds in all."""
        self._stop.set()
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(end - time.monotonic(), 0.0))


def _actor_process(
    index: int, recipe: ActorRecipe, address: str, table: str, raw: Any, stop: Any, errors: Any
) -> None:
    """Body of one actor process: a client, a remote writer and weights, the actor loop."""
    from rlreplay.net.client.client import Client
    from rlreplay.runtime.weights import RemoteWeights

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops actors through `stop`
    counters = np.frombuffer(raw, dtype=np.float64).reshape(-1, NUM_COUNTERS)[index]
    writer = None
    try:
        client = Client(address)
        writer = actor_writer(client, table, recipe.config.num_actors)
        actor = recipe.build(index, writer, RemoteWeights(client, stop=stop), counters, stop)
        actor.run()
    except ClosedError:
        if not stop.is_set():
            errors.put((index, traceback.format_exc()))
            raise SystemExit(1) from None
    except BaseException:
        if not stop.is_set():
            errors.put((index, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if writer is not None and stop.is_set():
            # Stopped: what the writer still holds is not wanted; do not wait at exit.
            with contextlib.suppress(Exception):
                writer.close(timeout=0.05)


class ProcessActors:
    """Actors as spawned processes that write and pull weights through the server at ``address``."""

    def __init__(self, recipe: ActorRecipe, address: str, table: str):
        try:
            pickle.dumps(recipe)
        except Exception as exc:
            raise InvalidArgumentError(
                f"the processes backend sends make_env, make_policy and the adder factory to "
                f"new processes, but they cannot be pickled ({exc}); define them at module "
                "level (not as lambdas or local functions), or use backend='threads'"
            ) from exc
        self.recipe = recipe
        self.address = address
        self.table = table
        self._ctx = mp.get_context("spawn")
        n = recipe.config.num_actors
        self._raw = self._ctx.RawArray("d", n * NUM_COUNTERS)
        self._counters = np.frombuffer(self._raw, dtype=np.float64).reshape(n, NUM_COUNTERS)
        self._stop = StopFlag(self._ctx)  # a killed actor cannot wedge it (see StopFlag)
        self._errors = self._ctx.Queue()
        self._procs: list[Any] = []

    def start(self) -> None:
        for i in range(self.recipe.config.num_actors):
            proc = self._ctx.Process(
                target=_actor_process,
                args=(i, self.recipe, self.address, self.table, self._raw, self._stop,
                      self._errors),
                name=f"rlreplay-actor-{i}",
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)

    def counters(self) -> np.ndarray:
        return self._counters

    def done(self) -> bool:
        """Every actor handed its last step over (its process may still be exiting)."""
        return bool(self._procs) and bool(self._counters[:, FINISHED].all())

    def check(self) -> None:
        try:
            index, text = self._errors.get_nowait()
        except queue.Empty:
            pass
        else:
            last = text.strip().splitlines()[-1] if text.strip() else "no message"
            raise ComponentFailedError(
                f"actor {index}", f"{last} (pid {self._procs[index].pid})\n{text}"
            )
        for index, proc in enumerate(self._procs):
            code = proc.exitcode
            if code is None or self._stop.is_set():
                continue
            if code != 0 or not self._counters[index, FINISHED]:
                try:  # the traceback may still be on its way
                    index, text = self._errors.get(timeout=0.5)
                except queue.Empty:
                    pass
                else:
                    raise ComponentFailedError(f"actor {index}", f"(pid {proc.pid})\n{text}")
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                steps = int(self._counters[index, ENV_STEPS])
                hint = (
                    "; a process that dies before its first step often means the script "
                    "starting the run lacks an `if __name__ == \"__main__\":` guard, or "
                    "make_env or make_policy was defined in a notebook or a script read from "
                    "stdin, which the process cannot import (define them in a module file)"
                    if steps == 0 and code > 0 else ""
                )
                raise ComponentFailedError(
                    f"actor {index}",
                    f"its process (pid {proc.pid}) ended ({how}) after {steps} of "
                    f"{self.recipe.quota} env steps{hint}",
                )

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every actor to stop, wait ``timeout`` s for all together, kill the rest."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(1.0)
        self._errors.close()
        self._errors.join_thread()
