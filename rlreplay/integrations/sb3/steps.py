"""Observations stored once for SB3-style transition buffers (numpy and rlreplay only).

SB3's buffers keep ``observations`` and ``next_observations`` as two arrays of
``(buffer_size, n_envs, *shape)``. :class:`ObservationRing` keeps each observation once,
in an rlreplay :class:`~rlreplay.core.storage.StepStore` with one lane per environment:

* transition ``k`` of environment ``e`` (``k`` counts the ``add`` calls) reads its
  observation from ring step ``k % ring`` and its next observation from ring step
  ``(k + 1) % ring`` of lane ``e``, where ``ring = per_env + 1`` (one step more than the
  transitions kept, for the next observation of the newest transition);
* each ``add`` writes the new ``next_obs`` as the next step's observation; when the next
  ``add`` brings an ``obs`` that differs from it (an episode ended: ``next_obs`` was the
  final observation and ``obs`` is the reset one; or any other data), that final
  observation moves to a small side store (grown as needed, freed when its transition
  leaves the buffer) and the step's row takes the new ``obs``. So timeouts, dict
  observations and any autoreset scheme keep their exact next observations, and each
  observation is stored once except final ones.

A uniform batch is drawn with :func:`randint`, as SB3 draws it, and gathered by
:meth:`ObservationRing.transitions`; where the package's C extension is built, each is
one compiled call (``rlreplay/integrations/_sb3_transitions.c``) that gives exactly what
its numpy path gives, numpy's global generator included (tests compare the two).

A prioritized buffer adds a :class:`~rlreplay.core.table.Table` over the same store whose
items are the transitions (anchor: the observation's row; each item spans two steps of
its lane, so the store's overwrite protocol evicts it before either step is
overwritten): a ``Prioritized`` sampler and keys with generation stamps (an item replaced
since it was sampled gets a new key, so late priority updates for it are skipped). The
table draws the keys; the transitions are gathered from them by
:meth:`ObservationRing.transitions`, as for a uniform batch.

Nothing here imports torch or Stable-Baselines3.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.core.keys import SLOT_MASK, make_keys
from rlreplay.core.layout import ItemLayout, Window
from rlreplay.core.rate_limiters import MinSize
from rlreplay.core.selectors import Prioritized
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, check_count, describe

__all__ = ["ObservationRing", "randint"]

FieldSpecs = Mapping[str, tuple[tuple[int, ...], np.dtype]]
# obs, next_obs (field name to array), actions, rewards and dones of a batch
Arrays = dict[str, np.ndarray]
Transitions = tuple[Arrays, Arrays, np.ndarray, np.ndarray, np.ndarray]

_kernel = load_kernel("rlreplay.integrations._sb3_transitions")


def _randint_numpy(high: int, size: int) -> np.ndarray:
    return np.random.randint(0, high, size=size)


def _randint_compiled(high: int, size: int) -> np.ndarray:
    out = np.empty(size, dtype=np.int64)
    generator = np.random.get_bit_generator()
    with generator.lock:
        _kernel.randint(generator.capsule, high, out)
    return out


randint = _randint_numpy if _kernel is None else _randint_compiled
"""``np.random.randint(0, high, size=size)``: the same numbers from numpy's global
generator, which is left in the same state (SB3's seeding gives SB3's batches). Compiled,
one call of a few instructions per number where numpy's runs layers of checks."""


def _without_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class ObservationRing:
    """Each observation of ``n_envs`` streams stored once, for ``per_env`` transitions each.

    Args:
        fields: observation field name to ``(shape, dtype)`` (one field for an array
            observation, one per key for a dict observation).
        per_env: transitions kept per environment (SB3's ``buffer_size // n_envs``).
        n_envs: number of environments (lanes of the store).
        alpha: for a prioritized ring, the priority exponent; ``None``: no table.
        seed: seed of the table's random generator (prioritized only).

    Raises:
        InvalidArgumentError: for ``per_env`` or ``n_envs`` not ints >= 1, an empty
            ``fields`` or ``alpha`` outside ``[0, 1]``.
    """

    def __init__(
        self,
        fields: FieldSpecs,
        per_env: int,
        n_envs: int,
        alpha: float | None = None,
        seed: int | None = None,
    ):
        per_env = check_count(per_env, "per_env")
        n_envs = check_count(n_envs, "n_envs")
        if not fields:
            raise InvalidArgumentError(
                "fields={} is empty: give the observation's fields as {name: (shape, dtype)}"
            )
        if alpha is not None and not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
            raise InvalidArgumentError(
                f"alpha={describe(alpha)} must be a number in [0, 1] (0: uniform sampling)"
            )
        self.fields = {
            name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in fields.items()
        }
        self.names = tuple(self.fields)
        self.per_env = int(per_env)
        self.n_envs = int(n_envs)
        self.ring = self.per_env + 1
        self._derive()
        self.alpha = alpha
        self.seed = seed
        self._build(None)
        self.count = 0  # add calls so far: transition k of every env was added by call k
        # Per transition (flat: position * n_envs + env): 1 + the side store's slot of its
        # next observation when that is a final one (not the next row), else 0. Invariant:
        # the slots named here and those in ``free`` are the side store's slots, each once.
        self.final_at = np.zeros(self.per_env * self.n_envs, dtype=np.int32)
        self.side: dict[str, np.ndarray] = {
            name: np.zeros((0, *shape), dtype) for name, (shape, dtype) in self.fields.items()
        }
        self.free: list[int] = []

    # ------------------------------------------------------------------ parts
    DERIVED = ("_specs", "_single")  # from fields and n_envs; not pickled

    def _derive(self) -> None:
        # per field: shape, dtype, shape of one add's array and that shape without its
        # 1s (an array of this shape without 1s holds the same values in the same order)
        self._specs = {
            name: (shape, dtype, (n := (self.n_envs, *shape)), _without_ones(n))
            for name, (shape, dtype) in self.fields.items()
        }
        self._single = self._specs["obs"] if self.names == ("obs",) else None

    def _build(self, columns: Mapping[str, np.ndarray] | None) -> None:
        signature = {name: (shape, dtype.str) for name, (shape, dtype) in self.fields.items()}
        self.store = StepStore(
            signature, capacity=self.ring * self.n_envs, lanes=self.n_envs, columns=columns
        )
        self.columns = tuple(self.store.columns[name] for name in self.names)
        self.table: Table | None = None
        if self.alpha is not None:
            first = self.names[0]
            self.table = Table(
                "sb3",
                store=self.store,
                # two steps an item (a transition); the table's own batch reads one field
                layout=ItemLayout({first: Window(first)}, self.store.signature, span=2),
                sampler=Prioritized(priority_exponent=self.alpha),
                max_size=self.per_env * self.n_envs,
                rate_limiter=MinSize(1),
                seed=self.seed,
            )

    @property
    def size(self) -> int:
        """Transitions held per environment."""
        return min(self.count, self.per_env)

    @property
    def pos(self) -> int:
        """SB3's ``pos``: where the next transition of every environment goes."""
        return self.count % self.per_env

    # ---------------------------------------------------------------- writes
    def check(self, obs: Any, argument: str) -> dict[str, np.ndarray]:
        """``obs`` as one ``[n_envs, *shape]`` array per field (cast as SB3 assigns; a
        shape that differs only by axes of length 1 is reshaped, as SB3 broadcasts).

        Raises:
            InvalidArgumentError: naming ``argument``, if a field is missing or does not
                hold ``n_envs`` observations of the field's shape.
        """
        single = self._single
        if single is not None and type(obs) is np.ndarray:  # the common case
            if obs.dtype is single[1] and obs.shape == single[2]:  # as SB3's VecEnv gives
                return {"obs": obs}
            if obs.dtype != single[1]:
                obs = obs.astype(single[1])
            if _without_ones(obs.shape) == single[3]:
                return {"obs": obs.reshape(single[2])}
        if type(obs) is not dict:
            if len(self.names) == 1 and not isinstance(obs, Mapping):
                obs = {self.names[0]: obs}
            elif not isinstance(obs, Mapping):
                raise InvalidArgumentError(
                    f"{argument}={describe(obs)} must be a dict with keys {list(self.names)}"
                )
        out = {}
        for name, (shape, dtype, full_shape, squeezed) in self._specs.items():
            value = obs.get(name)
            if value is None and single is not None:
                raise InvalidArgumentError(
                    f"{argument} is a dict with keys {list(obs)}; this buffer stores "
                    f"{list(self.names)}: give an array for an array space, or a dict with "
                    "those keys for a Dict space"
                )
            if value is None:
                raise InvalidArgumentError(
                    f"{argument} has no key {name!r}; give every key of the observation "
                    f"space: {list(self.names)}"
                )
            if type(value) is not np.ndarray or value.dtype != dtype:
                value = np.asarray(value).astype(dtype, copy=False)
            if _without_ones(value.shape) != squeezed:
                where = argument if len(self.names) == 1 else f"{argument}[{name!r}]"
                raise InvalidArgumentError(
                    f"{where} has shape {value.shape}; give {self.n_envs} observation(s) of "
                    f"shape {shape} (an array of shape {full_shape}): this buffer was made "
                    f"for n_envs={self.n_envs}"
                )
            out[name] = value.reshape(full_shape)
        return out

    def add(self, obs: Mapping[str, np.ndarray], next_obs: Mapping[str, np.ndarray]) -> None:
        """Record transition ``count`` of every environment (arrays from :meth:`check`)."""
        n, k = self.n_envs, self.count
        p = k % self.per_env
        # transition k - per_env leaves, and the side slot of its final observation
        # (count_nonzero: any() costs a microsecond more)
        if k >= self.per_env and np.count_nonzero(leaving := self.final_at[p * n : p * n + n]):
            self.free.extend((leaving[leaving > 0] - 1).tolist())
            leaving.fill(0)
        store = self.store
        if k == 0:
            store.append(obs, validated=True)
        else:
            # The step's row holds the previous next_obs: does obs continue from it? (Bytes
            # compared: what is read back must be exactly what was given.)
            first = (k % self.ring) * n
            for name, col in zip(self.names, self.columns):
                if col[first : first + n].tobytes() != obs[name].tobytes():
                    self._episode_ends(obs, first, k)
                    break
        store.append(next_obs, validated=True)
        if self.table is not None:
            self.table.create_items(k * n + np.arange(n))
        self.count = k + 1

    def _episode_ends(self, obs: Mapping[str, np.ndarray], first: int, k: int) -> None:
        """Environments whose ``obs`` is not the previous ``next_obs``: that one moves to
        the side store as transition ``k - 1``'s final observation, ``obs`` takes its row.
        With one transition per environment, transition ``k - 1`` has just left (its
        position is ``k``'s), so its final observation is dropped."""
        n = self.n_envs
        q = (k - 1) % self.per_env
        kept = self.per_env > 1
        with self.store.mutex:
            for e in range(n):
                if all(
                    col[first + e].tobytes() == obs[name][e].tobytes()
                    for name, col in zip(self.names, self.columns)
                ):
                    continue
                if kept:
                    slot = self._side_slot()
                    for name, col in zip(self.names, self.columns):
                        self.side[name][slot] = col[first + e]
                    self.final_at[q * n + e] = slot + 1
                for name, col in zip(self.names, self.columns):
                    col[first + e] = obs[name][e]

    def _side_slot(self) -> int:
        if not self.free:  # every slot used: double the side store
            capacity = len(self.side[self.names[0]])
            grown = max(8, 2 * capacity)
            for name in self.names:
                old = self.side[name]
                new = np.zeros((grown, *old.shape[1:]), old.dtype)
                new[:capacity] = old
                self.side[name] = new
            self.free.extend(range(grown - 1, capacity - 1, -1))
        return self.free.pop()

    def reset(self) -> None:
        """Forget every transition (the arrays keep their memory)."""
        self.store.reset()
        self.count = 0
        self.final_at.fill(0)
        self.free = list(range(len(self.side[self.names[0]]) - 1, -1, -1))

    # ----------------------------------------------------------------- reads
    def transitions_of_slots(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """SB3 positions and environments of table slots (store rows of anchors)."""
        rows = slots & SLOT_MASK
        ring_steps, envs = np.divmod(rows, self.n_envs)
        k = self.count - (self.count - ring_steps) % self.ring
        return k % self.per_env, envs

    def flat(self, positions: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """The flat index ``position * n_envs + env`` of transitions at SB3 ``positions``
        of environments ``envs``: where they are in SB3's arrays seen flat, and in
        ``final_at``."""
        return positions * self.n_envs + envs if self.n_envs > 1 else positions

    def rows(self, positions: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """Store rows of the observations of transitions at SB3 ``positions`` of
        environments ``envs``; their next observations are ``next_rows(rows)``."""
        if self.count <= self.per_env:  # nothing overwritten yet: k is the position
            return self.flat(positions, envs)
        base = self.count - self.per_env
        k = base + (positions - base) % self.per_env
        if self.n_envs == 1:
            return k % self.ring
        return (k % self.ring) * self.n_envs + envs

    def next_rows(self, rows: np.ndarray) -> np.ndarray:
        if self.count < self.ring:  # the ring has not turned: no next row wraps
            return rows + self.n_envs
        return (rows + self.n_envs) % self.store.capacity

    def _transitions_numpy(
        self, positions: np.ndarray, envs: np.ndarray, steps: tuple[np.ndarray, ...]
    ) -> Transitions:
        flat = self.flat(positions, envs)
        rows = self.rows(positions, envs)
        obs = self.take(rows)
        next_obs = self.take(self.next_rows(rows))
        self.patch_finals(next_obs, flat)
        actions, rewards, dones, timeouts = steps
        # done and not a timeout, as SB3's dones * (1 - timeouts)
        terminal = np.greater(dones.take(flat), timeouts.take(flat))
        return (
            obs,
            next_obs,
            actions.take(flat, axis=0),
            rewards.take(flat).reshape(-1, 1),
            terminal.astype(np.float32).reshape(-1, 1),
        )

    def _transitions_compiled(
        self, positions: np.ndarray, envs: np.ndarray, steps: tuple[np.ndarray, ...]
    ) -> Transitions:
        n = len(positions)
        obs = {name: np.empty((n, *shape), dtype) for name, (shape, dtype) in self.fields.items()}
        next_obs = {
            name: np.empty((n, *shape), dtype) for name, (shape, dtype) in self.fields.items()
        }
        actions = np.empty((n, *steps[0].shape[1:]), steps[0].dtype)
        rewards = np.empty((n, 1), np.float32)
        dones = np.empty((n, 1), np.float32)
        _kernel.transitions(
            positions,
            envs,
            (self.count, self.per_env, self.n_envs),
            self.columns,
            tuple(self.side.values()),
            self.final_at,
            steps,
            (tuple(obs.values()), tuple(next_obs.values()), actions, rewards, dones),
        )
        return obs, next_obs, actions, rewards, dones

    transitions = _transitions_numpy if _kernel is None else _transitions_compiled
    """The transitions at SB3 ``positions`` of environments ``envs`` (int64 arrays):
    ``(obs, next_obs, actions, rewards, dones)``, each array fresh; ``steps`` holds
    SB3's per-transition arrays flat (``position * n_envs + env``): actions
    ``(slots, action_dim)``, float32 rewards, bool dones and timeouts. ``rewards`` and
    ``dones`` come as float32 ``(n, 1)``, ``dones`` true for a done that is not a
    timeout. Compiled, one call where numpy's gathers make a dozen, each of which costs
    several times more inside training (the network's step has emptied the CPU's caches)
    than alone; tests compare the two paths."""

    def take(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The observation fields at store ``rows``: one fresh array per field."""
        return {name: col.take(rows, axis=0) for name, col in zip(self.names, self.columns)}

    def gather(
        self, positions: np.ndarray, envs: np.ndarray, next_obs: bool
    ) -> dict[str, np.ndarray]:
        """Observations (``next_obs=False``) or next observations of transitions at SB3
        ``positions`` of environments ``envs``: one fresh array per field."""
        rows = self.rows(positions, envs)
        if not next_obs:
            return self.take(rows)
        out = self.take(self.next_rows(rows))
        self.patch_finals(out, self.flat(positions, envs))
        return out

    def patch_finals(self, next_obs: dict[str, np.ndarray], flat: np.ndarray) -> None:
        """Put the side store's final observations into gathered ``next_obs`` of the
        transitions ``flat`` (``position * n_envs + env``)."""
        at = self.final_at.take(flat)
        which = at.nonzero()[0]
        if len(which) == 0:
            return
        slots = at.take(which) - 1
        for name in self.names:
            next_obs[name][which] = self.side[name].take(slots, axis=0)

    def sb3_array(self, name: str, next_obs: bool) -> np.ndarray:
        """One field in SB3's layout ``(per_env, n_envs, *shape)``: a copy, zeros where
        nothing was added yet (as SB3's arrays start)."""
        shape, dtype = self.fields[name]
        out = np.zeros((self.per_env, self.n_envs, *shape), dtype)
        held = self.size
        if held:
            positions = np.repeat(np.arange(held), self.n_envs)
            envs = np.tile(np.arange(self.n_envs), held)
            values = self.gather(positions, envs, next_obs)[name]
            out[:held] = values.reshape(held, self.n_envs, *shape)
        return out

    # ------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        state = {
            key: value
            for key, value in self.__dict__.items()
            if key not in ("store", "columns", "table", *self.DERIVED)
        }
        state["store_columns"] = {name: np.array(col) for name, col in self.store.columns.items()}
        state["store_next_id"] = self.store.next_id
        if self.table is not None and self.size:
            keys, priorities = self.held_priorities()
            state["priorities"] = (keys & SLOT_MASK, priorities)
            state["max_priority"] = float(self.table.index.max_priority)
        if self.table is not None:
            # keys sampled before saving stay valid after loading; draws go on alike
            state["generations"] = np.array(self.table.index.generation)
            state["rng"] = self.table.rng.bit_generator.state
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        columns = state.pop("store_columns")
        next_id = state.pop("store_next_id")
        priorities = state.pop("priorities", None)
        max_priority = state.pop("max_priority", None)
        rng = state.pop("rng", None)
        generations = state.pop("generations", None)
        self.__dict__.update(state)
        self._derive()
        self._build(columns)
        self.store.load_state({"next_id": next_id})
        if self.table is not None and priorities is not None:
            anchors, values = priorities
            # Rows back to step ids: the newest held step is count (the head).
            ring_steps, envs = np.divmod(anchors, self.n_envs)
            k = self.count - (self.count - ring_steps) % self.ring
            self.table.create_items(k * self.n_envs + envs, values)
            self.table.index.max_priority = max_priority
        if self.table is not None and generations is not None:
            # keys issued before saving name the same items; draws go on where they were
            self.table.index.generation[:] = generations
            self.table.rng.bit_generator.state = rng

    def held_priorities(self) -> tuple[np.ndarray, np.ndarray]:
        """Keys and priorities of every held transition, oldest first (prioritized)."""
        assert self.table is not None
        held = self.size
        k = np.repeat(np.arange(self.count - held, self.count), self.n_envs)
        envs = np.tile(np.arange(self.n_envs), held)
        slots = (k % self.ring) * self.n_envs + envs
        index = self.table.index
        keys = make_keys(slots, index.generation[slots], index.origin)
        return keys, np.array(index.priority[slots], dtype=np.float64)
