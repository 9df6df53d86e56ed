"""The rows of each environment's current episode that an adder still holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlreplay.core.specs import Signature


class EpisodeRows:
    """Per-environment buffers of episode rows: one array per stored input field,
    ``[num_envs, capacity, *shape]`` with the signature's dtype.

    Slot ``k`` of environment ``i`` holds episode row ``base[i] + k``. A row is written
    once (a step's fields when it is recorded, its observation one row ahead) and dropped
    from the front (:meth:`keep_from`) once it is appended and no later item reaches it.

    Args:
        signature: the store's step signature.
        paths: the fields held (the adder's inputs).
        num_envs: environments.
        capacity: rows held per environment.
    """

    def __init__(self, signature: Signature, paths: Sequence[str], num_envs: int, capacity: int):
        self.capacity = capacity
        self.arrays = {
            p: np.zeros((num_envs, capacity, *signature[p].shape), dtype=signature[p].dtype)
            for p in paths
        }
        self.base = np.zeros(num_envs, dtype=np.int64)  # episode row held in slot 0
        # Each buffer as [num_envs * capacity, *shape] (views): one index per row written.
        self._flat = {
            p: a.reshape(num_envs * capacity, *a.shape[2:]) for p, a in self.arrays.items()
        }
        self._offsets = np.arange(num_envs, dtype=np.int64) * capacity

    def write(self, idx: np.ndarray, rows: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        """Write ``values[p][k]`` into episode row ``rows[k]`` of environment ``idx[k]``."""
        slots = rows - self.base[idx]
        for path, arr in values.items():
            self.arrays[path][idx, slots] = arr

    def write_first(self, idx: np.ndarray, count: int, obs: Mapping[str, np.ndarray]) -> None:
        """Write ``obs[p][k]`` into episode rows ``0 .. count - 1`` of environment
        ``idx[k]``, whose episode starts (``base`` 0, see :meth:`clear`)."""
        slots = self._offsets[idx]
        for r in range(count):
            for path, arr in obs.items():
                self._flat[path][slots + r] = arr

    def write_step(
        self,
        idx: np.ndarray,
        rows: np.ndarray,
        fields: Mapping[str, np.ndarray],
        obs: Mapping[str, np.ndarray],
    ) -> None:
        """Write one step of environments ``idx``: ``fields[p][k]`` into episode row
        ``rows[k]`` of environment ``idx[k]`` and the observation it led to, ``obs[p][k]``,
        into the row after it (:meth:`write` twice, locating the slots once)."""
        slots = rows - self.base[idx]
        for path, arr in fields.items():
            self.arrays[path][idx, slots] = arr
        slots += 1
        for path, arr in obs.items():
            self.arrays[path][idx, slots] = arr

    def write_all(
        self,
        rows: np.ndarray,
        fields: Mapping[str, np.ndarray],
        obs: Mapping[str, np.ndarray],
    ) -> None:
        """:meth:`write_step` for every environment (``rows[i]`` for environment ``i``)."""
        slots = rows - self.base
        slots += self._offsets  # flat positions in [num_envs * capacity]
        flat = self._flat
        for path, arr in fields.items():
            flat[path][slots] = arr
        slots += 1
        for path, arr in obs.items():
            flat[path][slots] = arr

    def rows(self, i: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Views of episode rows ``[lo, hi)`` of environment ``i``, per field."""
        b = int(self.base[i])
        return {p: a[i, lo - b : hi - b] for p, a in self.arrays.items()}

    def copy_rows(self, i: int, lo: int, hi: int, out: Mapping[str, np.ndarray]) -> None:
        """Copy episode rows ``[lo, hi)`` of environment ``i`` into ``out`` (per field)."""
        start = int(self._offsets[i] - self.base[i])  # flat position of episode row 0
        lo, hi = start + lo, start + hi
        for p, a in self._flat.items():
            out[p][:] = a[lo:hi]

    def field(self, path: str, i: int, lo: int, hi: int) -> np.ndarray:
        """View of field ``path`` at episode rows ``[lo, hi)`` of environment ``i``."""
        start = int(self._offsets[i] - self.base[i])  # flat position of episode row 0
        return self._flat[path][start + lo : start + hi]

    def keep_from(self, i: int, row: int) -> None:
        """Drop environment ``i``'s rows before episode row ``row``."""
        shift = row - int(self.base[i])
        if shift <= 0:
            return
        for arr in self.arrays.values():
            held = arr[i]
            held[: self.capacity - shift] = held[shift:]
            held[self.capacity - shift :] = 0
        self.base[i] = row

    def clear(self, idx: np.ndarray | slice) -> None:
        """Forget the episodes of environments ``idx`` (their next ones start at row 0,
        every row zero: a final row's fields stay zero)."""
        for arr in self.arrays.values():
            arr[idx] = 0
        self.base[idx] = 0
