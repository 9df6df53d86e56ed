"""Stable-Baselines3 replay buffers over rlreplay: observations stored once, prioritized.

The classes subclass SB3's buffers of the same names and keep their interface: the
constructor as SB3 calls it, ``add(obs, next_obs, action, reward, done, infos)``,
``sample(batch_size, env=None)`` returning SB3's sample tuples on ``device``,
``_get_samples(batch_inds, env)``, ``size()``, ``reset()``, ``pos``, ``full``, and the
arrays ``actions``, ``rewards``, ``dones`` and ``timeouts`` in SB3's layout
``(buffer_size, n_envs, ...)`` (they are the buffer's own: writing into them changes the
buffer, as SB3's code does for ``dones``). ``observations`` and ``next_observations`` are
copies in that layout, built when read: the observations live once in an rlreplay step
store (see :mod:`rlreplay.integrations.sb3.steps`).

Sampling draws from numpy's global generator exactly as SB3's buffers do (a position,
then an environment), so with the same seed and the same data the uniform buffers return
the same batches as SB3's.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common import buffers as sb3_buffers
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from rlreplay.errors import EmptyTableError, InvalidArgumentError, check_count, describe
from rlreplay.integrations.sb3.steps import ObservationRing, Transitions, randint

__all__ = [
    "DictReplayBuffer",
    "NStepReplayBuffer",
    "PrioritizedDictReplayBuffer",
    "PrioritizedDictReplayBufferSamples",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferSamples",
    "ReplayBuffer",
    "observation_fields",
]

_FLOAT32 = np.dtype(np.float32)
_BOOL = np.dtype(bool)

# SB3's own classes, kept before anything may rebind the names in SB3's module.
_SB3ReplayBuffer = sb3_buffers.ReplayBuffer
_SB3DictReplayBuffer = sb3_buffers.DictReplayBuffer
_SB3NStepReplayBuffer = sb3_buffers.NStepReplayBuffer


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` plus ``weights`` (importance weights, ``[B, 1]`` on
    the buffer's device) and ``keys`` (numpy int64, for ``update_priorities``)."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    keys: np.ndarray


class PrioritizedDictReplayBufferSamples(NamedTuple):
    """SB3's ``DictReplayBufferSamples`` plus ``weights`` and ``keys``."""

    observations: dict[str, th.Tensor]
    actions: th.Tensor
    next_observations: dict[str, th.Tensor]
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    keys: np.ndarray


def observation_fields(space: spaces.Space) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The stored fields of an observation space as ``{name: (shape, dtype)}``: ``"obs"``
    for an array space (a ``Discrete`` one is ``(1,)``, as SB3 stores it), one field per
    key (in the space's order) for a ``Dict`` space.

    Raises:
        InvalidArgumentError: for a space that is not a gymnasium space SB3 can store, or
            a ``Dict`` space with no keys, a key that is not a non-empty string without
            ``/`` (the keys name the stored fields) or a nested ``Dict`` or ``Tuple``.
    """
    if not isinstance(space, spaces.Space):
        raise InvalidArgumentError(f"observation_space={describe(space)} must be a gymnasium space")
    if isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        bad = [key for key in keys if not isinstance(key, str) or not key or "/" in key]
        if bad or not keys:
            raise InvalidArgumentError(
                f"observation_space={describe(space)} has "
                + (f"the key {bad[0]!r}" if bad else "no keys")
                + ": each key names a stored field, so give non-empty string keys "
                "without '/' (rename the keys, e.g. with a gymnasium ObservationWrapper)"
            )
        nested = [key for key in keys if isinstance(space[key], (spaces.Dict, spaces.Tuple))]
        if nested:
            raise InvalidArgumentError(
                f"observation_space={describe(space)} nests a {type(space[nested[0]]).__name__} "
                f"space under the key {nested[0]!r}; SB3's Dict buffers store one array per "
                "key: flatten the nested spaces (e.g. with a gymnasium ObservationWrapper)"
            )
    try:
        shape = get_obs_shape(space)
    except NotImplementedError as error:
        raise InvalidArgumentError(
            f"observation_space={describe(space)} is not a space SB3's buffers store ({error})"
        ) from None
    if isinstance(space, spaces.Dict):
        return {key: (tuple(shape[key]), np.dtype(space[key].dtype)) for key in space.spaces}
    return {"obs": (tuple(shape), np.dtype(space.dtype))}


def _check_unit(name: str, value: Any) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if not ok or not 0.0 <= float(value) <= 1.0:
        raise InvalidArgumentError(f"{name}={describe(value)} must be a number in [0, 1]")
    return float(value)


class ReplayBuffer(_SB3ReplayBuffer):
    """SB3's ``ReplayBuffer`` with each observation stored once, timeouts included.

    Args:
        buffer_size: transitions kept in all (``buffer_size // n_envs`` per environment).
        observation_space: the environment's observation space.
        action_space: the environment's action space.
        device: torch device of the sampled tensors.
        n_envs: number of environments of each ``add``.
        optimize_memory_usage: accepted for SB3's calls; observations are always stored
            once here, timeouts and dicts included, so the buffer needs none of SB3's
            restrictions for it and reports ``False``.
        handle_timeout_termination: read timeouts from ``infos[i]["TimeLimit.truncated"]``
            and sample ``done = 0`` for them (bootstrapping from the true final
            observation, which is kept).
        n_steps: n-step returns when > 1 (``NStepReplayBuffer``'s defaults to 3).
        gamma: discount of the n-step returns.

    Raises:
        InvalidArgumentError: for a bad argument (the message names it).
    """

    _dict_obs = False
    _samples_type: type = ReplayBufferSamples  # what sample() returns

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        n_steps: int = 1,
        gamma: float = 0.99,
    ):
        buffer_size = check_count(buffer_size, "buffer_size")
        n_envs = check_count(n_envs, "n_envs")
        n_steps = check_count(n_steps, "n_steps")
        gamma = _check_unit("gamma", gamma)
        fields = observation_fields(observation_space)
        if isinstance(observation_space, spaces.Dict) != self._dict_obs:
            fix = "DictReplayBuffer" if not self._dict_obs else "ReplayBuffer"
            raise InvalidArgumentError(
                f"observation_space={describe(observation_space)} "
                f"{'is' if not self._dict_obs else 'is not'} a Dict space; use {fix} "
                f"(or its prioritized form) for it"
            )
        if not isinstance(action_space, spaces.Space):
            raise InvalidArgumentError(f"action_space={describe(action_space)} must be a space")
        # BaseBuffer's attributes, set here: SB3's constructors would allocate both
        # observation arrays.
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_shape = get_obs_shape(observation_space)  # type: ignore[assignment]
        self.action_dim = get_action_dim(action_space)
        self.device = get_device(device)
        self.n_envs = n_envs
        self.optimize_memory_usage = False
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.n_steps = n_steps
        # SB3's NStepReplayBuffer returns discounts even for n_steps=1
        self._one_step = n_steps == 1 and not isinstance(self, _SB3NStepReplayBuffer)
        self.gamma = gamma
        alpha = getattr(self, "alpha", None)  # set first by the prioritized buffers
        # a prioritized table's generator, seeded from numpy's (which SB3 seeds)
        seed = int(np.random.randint(0, 2**31 - 1)) if alpha is not None else None
        self._ring = ObservationRing(fields, self.buffer_size, n_envs, alpha=alpha, seed=seed)
        shape = (self.buffer_size, n_envs)
        self.actions = np.zeros(
            (*shape, self.action_dim), dtype=self._maybe_cast_dtype(action_space.dtype)
        )
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.dones = np.zeros(shape, dtype=bool)
        self.timeouts = np.zeros(shape, dtype=bool)
        self._make_views()

    # ------------------------------------------------------------ SB3 state
    @property
    def pos(self) -> int:  # type: ignore[override]
        """Where the next ``add`` writes (SB3's index into ``actions`` etc.)."""
        return self._ring.pos

    @pos.setter
    def pos(self, value: int) -> None:
        if value != self._ring.pos:
            raise InvalidArgumentError(
                f"pos={describe(value)} cannot be set (it is {self._ring.pos}): the buffer "
                "moves it as transitions are added; use reset() to empty the buffer"
            )

    @property
    def full(self) -> bool:  # type: ignore[override]
        """Whether ``buffer_size`` transitions are held."""
        return self._ring.count >= self._ring.per_env

    @full.setter
    def full(self, value: bool) -> None:
        if bool(value) == self.full:
            return
        if value and self._ring.count == 0:
            # SB3's arrays start as zeros: a full empty buffer samples zero transitions.
            zero_obs = {
                name: np.zeros((self.n_envs, *shape), dtype)
                for name, (shape, dtype) in self._ring.fields.items()
            }
            for _ in range(self.buffer_size):
                self._ring.add(zero_obs, zero_obs)
            return
        raise InvalidArgumentError(
            f"full={describe(value)} cannot be set on a buffer holding {self.size()} of "
            f"{self.buffer_size} transitions per env (only an empty buffer can be declared "
            "full, as SB3's zero-filled one); add transitions or call reset()"
        )

    @property
    def observations(self) -> np.ndarray | dict[str, np.ndarray]:  # type: ignore[override]
        """A copy of the observations in SB3's layout ``(buffer_size, n_envs, *shape)``
        (a dict of them for dict observations)."""
        return self._sb3_arrays(next_obs=False)

    @property
    def next_observations(self) -> np.ndarray | dict[str, np.ndarray]:  # type: ignore[override]
        """A copy of the next observations in SB3's layout."""
        return self._sb3_arrays(next_obs=True)

    def _sb3_arrays(self, next_obs: bool) -> np.ndarray | dict[str, np.ndarray]:
        out = {name: self._ring.sb3_array(name, next_obs) for name in self._ring.names}
        return out if self._dict_obs else out["obs"]

    def size(self) -> int:
        return self._ring.size

    def reset(self) -> None:
        self._ring.reset()
        for array in (self.actions, self.rewards, self.dones, self.timeouts):
            array[:] = 0

    def nbytes(self) -> int:
        """Bytes this buffer holds: stored observations (with final ones), SB3's small
        arrays, and a prioritized buffer's item index."""
        ring = self._ring
        total = ring.store.nbytes + ring.final_at.nbytes
        total += sum(side.nbytes for side in ring.side.values())
        total += sum(a.nbytes for a in (self.actions, self.rewards, self.dones, self.timeouts))
        if ring.table is not None:
            total += ring.table.index_nbytes()
        return total

    # ------------------------------------------------------------------ add
    def add(  # type: ignore[override]
        self,
        obs: np.ndarray | dict[str, np.ndarray],
        next_obs: np.ndarray | dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None,
    ) -> None:
        """Add one transition per environment (arrays of ``n_envs``).

        Raises:
            InvalidArgumentError: naming the argument whose shape does not hold
                ``n_envs`` entries, or ``infos`` not a list of ``n_envs`` dicts while
                timeouts are handled; nothing is added then.
        """
        ring = self._ring
        obs_ = ring.check(obs, "obs")
        next_obs_ = ring.check(next_obs, "next_obs")
        n = self.n_envs
        if not (  # the arrays as SB3's VecEnv gives them are stored as they are
            type(action) is np.ndarray
            and action.dtype is self._action_dtype
            and action.size == self._action_shape[0] * self._action_shape[1]
            and type(reward) is np.ndarray
            and reward.dtype is _FLOAT32
            and reward.shape == self._env_shape
            and type(done) is np.ndarray
            and done.dtype is _BOOL
            and done.shape == self._env_shape
        ):
            action, reward, done = self._cast(action, reward, done)
        timeouts: Any = False
        if self.handle_timeout_termination:
            try:
                if len(infos) != n:  # type: ignore[arg-type]
                    raise TypeError
                timeouts = [bool(info.get("TimeLimit.truncated", False)) for info in infos]  # type: ignore[union-attr]
            except (TypeError, AttributeError):
                raise InvalidArgumentError(
                    f"infos={describe(infos)} must be a list of {n} dicts (one per "
                    "environment, as SB3's VecEnv returns) while handle_timeout_termination "
                    "is True; pass handle_timeout_termination=False to ignore timeouts"
                ) from None
        p = ring.count % ring.per_env
        ring.add(obs_, next_obs_)
        self.actions[p] = action.reshape(self._action_shape)
        self.rewards[p] = reward
        self.dones[p] = done
        self.timeouts[p] = timeouts

    def _cast(
        self, action: Any, reward: Any, done: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``action``, ``reward`` and ``done`` cast as SB3's assignments cast them, as
        arrays of ``(n_envs, action_dim)``, ``(n_envs,)`` and ``(n_envs,)``.

        Raises:
            InvalidArgumentError: naming the argument that does not hold ``n_envs``
                entries, or when the values cannot be stored as numbers.
        """
        n = self.n_envs
        action, reward, done = np.asarray(action), np.asarray(reward), np.asarray(done)
        for name, value in (("action", action), ("reward", reward), ("done", done)):
            if value.dtype.kind in "OSUV":  # None, strings, objects: numpy would cast them
                raise InvalidArgumentError(
                    f"{name}={describe(value if value.ndim else value.item())} is not numeric; "
                    "give a number (bool for done) per environment"
                )
        if action.size != n * self.action_dim:
            raise InvalidArgumentError(
                f"action has shape {action.shape}; give {n} action(s) of {self.action_dim} "
                f"value(s) each (an array of shape {(n, self.action_dim)})"
            )
        for name, value in (("reward", reward), ("done", done)):
            if value.size != n:
                raise InvalidArgumentError(
                    f"{name} has shape {value.shape}; give one value per environment (shape ({n},))"
                )
        try:
            action = action.reshape(n, self.action_dim).astype(self.actions.dtype, copy=False)
            reward = reward.reshape(n).astype(np.float32, copy=False)
            done = done.reshape(n).astype(bool, copy=False)
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(
                f"action, reward or done cannot be stored as numbers ({error}); give numeric "
                "arrays of one entry per environment"
            ) from None
        return action, reward, done

    # --------------------------------------------------------------- sample
    def sample(  # type: ignore[override]
        self, batch_size: int, env: VecNormalize | None = None
    ) -> ReplayBufferSamples | DictReplayBufferSamples:
        """Sample ``batch_size`` transitions uniformly (with replacement), as SB3 does.

        Raises:
            InvalidArgumentError: for ``batch_size`` not an int >= 1.
            EmptyTableError: if nothing was added yet.
        """
        batch_size = self._check_sample(batch_size)
        return self._get_samples(randint(self._ring.size, batch_size), env=env)

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> ReplayBufferSamples | DictReplayBufferSamples:
        """SB3's ``_get_samples``: transitions at positions ``batch_inds``."""
        if self.n_envs == 1:  # SB3 draws from [0, 1), which leaves the generator as it was
            env_indices = _zeros(len(batch_inds))
        else:
            env_indices = randint(self.n_envs, len(batch_inds))
        parts = self._samples(np.ascontiguousarray(batch_inds, dtype=np.int64), env_indices, env)
        return self._samples_type(*parts)

    def _check_sample(self, batch_size: Any) -> int:
        if type(batch_size) is not int or batch_size < 1:
            batch_size = check_count(batch_size, "batch_size")
        if self._ring.count == 0:
            raise EmptyTableError(
                "sample() on an empty replay buffer: add transitions first (SB3 waits "
                "for learning_starts steps)"
            )
        return batch_size

    def _samples(self, positions: np.ndarray, envs: np.ndarray, env: VecNormalize | None) -> tuple:
        """The parts of SB3's sample tuple for transitions at ``positions`` of ``envs``."""
        ring = self._ring
        if self._one_step:
            return self._finish(ring.transitions(positions, envs, self._steps), env)
        obs = ring.gather(positions, envs, next_obs=False)
        actions = self._steps[0].take(ring.flat(positions, envs), axis=0)
        last, dones, returns, discounts = self._n_step(positions, envs, env)
        next_obs = ring.gather(last, envs, next_obs=True)
        return self._finish((obs, next_obs, actions, returns, dones), env, discounts)

    def _finish(
        self, parts: Transitions, env: VecNormalize | None, discounts: np.ndarray | None = None
    ) -> tuple:
        """SB3's sample tuple of gathered ``parts``: normalized by ``env`` when given (the
        rewards of one-step parts; n-step returns come normalized), as tensors."""
        obs, next_obs, actions, rewards, dones = parts
        if env is not None and discounts is None:
            rewards = self._normalize_reward(rewards, env)
        tensor = th.from_numpy if self._on_cpu else self._tensor
        if self._dict_obs:
            obs_out: Any = self._normalize_obs(obs, env) if env is not None else obs
            next_out: Any = self._normalize_obs(next_obs, env) if env is not None else next_obs
            obs_t: Any = {key: tensor(value) for key, value in obs_out.items()}
            next_t: Any = {key: tensor(value) for key, value in next_out.items()}
        else:
            obs_t, next_t = obs["obs"], next_obs["obs"]
            if env is not None:
                obs_t, next_t = self._normalize_obs(obs_t, env), self._normalize_obs(next_t, env)
            obs_t, next_t = tensor(obs_t), tensor(next_t)
        return (
            obs_t,
            tensor(actions),
            next_t,
            tensor(dones),
            tensor(rewards),
            None if discounts is None else tensor(discounts),
        )

    def _make_views(self) -> None:
        """Flat views of SB3's arrays, indexed by ``position * n_envs + env``, and the
        dtype and shapes of the arrays ``add`` stores without a cast."""
        # actions, rewards, dones and timeouts, flat (ObservationRing.transitions' steps)
        self._steps = (
            self.actions.reshape(-1, self.action_dim),
            self.rewards.reshape(-1),
            self.dones.reshape(-1),
            self.timeouts.reshape(-1),
        )
        self._on_cpu = self.device.type == "cpu"
        self._action_dtype = self.actions.dtype
        self._action_shape = (self.n_envs, self.action_dim)
        self._env_shape = (self.n_envs,)

    def __getstate__(self) -> dict[str, Any]:
        views = ("_steps", "_on_cpu")
        views += ("_action_dtype", "_action_shape", "_env_shape")
        return {key: value for key, value in self.__dict__.items() if key not in views}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._make_views()

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "device" and "timeouts" in self.__dict__:  # SB3's load sets the device
            self._on_cpu = th.device(self.device).type == "cpu"

    def _tensor(self, array: np.ndarray) -> th.Tensor:
        """A tensor on ``device``; on the CPU it shares the fresh array's memory (every
        sampled array is the sample's own), elsewhere one copy to the device."""
        if self._on_cpu:
            return th.from_numpy(array)
        return th.as_tensor(array, device=self.device)

    def _n_step(
        self, positions: np.ndarray, envs: np.ndarray, env: VecNormalize | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """SB3's n-step rule: rewards summed up to the first done or timeout (inclusive),
        the newest transition counting as a timeout unless done; returns the positions
        of the last transitions, dones, n-step returns and bootstrap discounts."""
        n = self.n_steps
        steps = np.arange(n)
        idx = (positions[:, None] + steps) % self.buffer_size
        col = envs[:, None]
        rewards_seq = self._normalize_reward(self.rewards[idx, col], env)
        dones_seq = self.dones[idx, col]
        newest = (self.pos - 1) % self.buffer_size
        truncated_seq = self.timeouts[idx, col] | ((idx == newest) & ~dones_seq)
        ended = dones_seq | truncated_seq
        done_idx = np.where(ended.any(axis=1), ended.argmax(axis=1), n - 1)
        mask = steps[None, :] <= done_idx[:, None]
        # float32 powers, as SB3 computes them (the same roundings)
        discounts = self.gamma ** mask.sum(axis=1, keepdims=True).astype(np.float32)
        powers = self.gamma ** np.arange(n, dtype=np.float32).reshape(1, -1)
        returns = (rewards_seq * powers * mask).sum(axis=1, keepdims=True)
        last = (positions + done_idx) % self.buffer_size
        rows = np.arange(len(positions))
        final_dones = dones_seq[rows, done_idx] & ~truncated_seq[rows, done_idx]
        return last, final_dones.astype(np.float32).reshape(-1, 1), returns, discounts


_ZEROS: dict[int, np.ndarray] = {}


def _zeros(n: int) -> np.ndarray:
    """A read-only int64 array of ``n`` zeros (the environments of one-env batches)."""
    zeros = _ZEROS.get(n)
    if zeros is None:
        zeros = _ZEROS[n] = np.zeros(n, dtype=np.int64)
        zeros.flags.writeable = False
    return zeros


class DictReplayBuffer(ReplayBuffer, _SB3DictReplayBuffer):
    """SB3's ``DictReplayBuffer`` with each observation stored once (timeouts and
    n-step returns included, which SB3's cannot combine with that); arguments as
    :class:`ReplayBuffer`."""

    _dict_obs = True
    _samples_type = DictReplayBufferSamples


class NStepReplayBuffer(ReplayBuffer, _SB3NStepReplayBuffer):
    """SB3's ``NStepReplayBuffer`` (n-step returns computed when sampling, with
    ``discounts``) over observations stored once; ``n_steps`` defaults to 3."""

    def __init__(self, *args: Any, n_steps: int = 3, gamma: float = 0.99, **kwargs: Any):
        super().__init__(*args, n_steps=n_steps, gamma=gamma, **kwargs)


#: Samples a prioritized buffer draws without any update_priorities call before it warns.
SAMPLES_BEFORE_WARNING = 1_000


class _Prioritized:
    """Prioritized sampling over a buffer's transitions (mixed into the buffers below)."""

    _ring: ObservationRing
    _dict_obs: bool
    device: th.device
    # samples drawn before the first update_priorities (None after it, or for alpha 0): a
    # loop that never sends priorities back samples uniformly, which it is told once
    _samples_before_update: int | None = 0

    def _setup_priorities(self, beta: float, final_beta: float, eps: float) -> None:
        self.beta = _check_unit("beta", beta)
        self.final_beta = _check_unit("final_beta", final_beta)
        number = isinstance(eps, (int, float, np.floating)) and not isinstance(eps, bool)
        if not (number and math.isfinite(eps) and eps > 0):
            raise InvalidArgumentError(
                f"eps={describe(eps)} must be a finite number > 0 (added to |TD error| so "
                "that no transition gets priority 0)"
            )
        self.eps = float(eps)
        self.progress = 0.0

    @property
    def progress(self) -> float:
        """The fraction of training done, in [0, 1] (values outside are clamped); the
        prioritized algorithms set it.

        Raises:
            InvalidArgumentError: on setting it to anything but a finite number.
        """
        return self._progress

    @progress.setter
    def progress(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or (
            not math.isfinite(value)
        ):
            raise InvalidArgumentError(
                f"progress={describe(value)} must be a finite number: the fraction of "
                "training done, from 0 to 1"
            )
        self._progress = min(max(float(value), 0.0), 1.0)

    @property
    def current_beta(self) -> float:
        """``beta`` moved linearly to ``final_beta`` as ``progress`` goes from 0 to 1 (the
        prioritized algorithms set ``progress`` to the fraction of training done)."""
        return self.beta + (self.final_beta - self.beta) * self._progress

    @property
    def table(self) -> Any:
        """The rlreplay :class:`~rlreplay.Table` whose items are the transitions."""
        return self._ring.table

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> Any:
        """Sample ``batch_size`` transitions with probability ``p_i ** alpha / sum``;
        the samples carry ``weights`` (``(N * P(i)) ** -beta``, divided by the batch's
        largest) and ``keys`` for :meth:`update_priorities`.

        Raises:
            InvalidArgumentError: for ``batch_size`` not an int >= 1.
            EmptyTableError: if nothing was added yet.
        """
        batch_size = self._check_sample(batch_size)  # type: ignore[attr-defined]
        if self._samples_before_update is not None:
            self._samples_before_update += 1
            if self._samples_before_update == SAMPLES_BEFORE_WARNING:
                warnings.warn(
                    f"{type(self).__name__}: {SAMPLES_BEFORE_WARNING} samples and no "
                    "update_priorities call, so every transition keeps its first priority "
                    "and sampling is uniform; train with PrioritizedDQN, PrioritizedSAC, "
                    "PrioritizedTD3 or PrioritizedDDPG, or call "
                    "buffer.update_priorities(samples.keys, td_errors) after each update",
                    RuntimeWarning,
                    stacklevel=2,
                )
        ring = self._ring
        table = ring.table
        # A table draws at most max_size at once; SB3 allows larger batches (with
        # replacement), so those come in parts.
        parts_ = [
            table.sample(min(rest, table.max_size), timeout=1.0)  # never waits: not empty
            for rest in range(batch_size, 0, -table.max_size)
        ]
        keys = np.concatenate([part.info.keys for part in parts_])
        probabilities = np.concatenate([part.info.probabilities for part in parts_])
        positions, envs = ring.transitions_of_slots(keys)
        parts = self._samples(positions, envs, env)  # type: ignore[attr-defined]
        # PER's importance weights, (N * P(i)) ** -beta over the batch's largest.
        weights = np.power(parts_[0].info.table_size * probabilities, -self.current_beta)
        weights = (weights / weights.max()).astype(np.float32).reshape(-1, 1)
        cls = (
            PrioritizedDictReplayBufferSamples if self._dict_obs else PrioritizedReplayBufferSamples
        )
        return cls(*parts, self._tensor(weights), keys)  # type: ignore[attr-defined]

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of sampled transitions to ``|priorities| + eps`` (pass the
        TD errors); keys of transitions replaced since they were sampled are skipped.

        Args:
            keys: the ``keys`` of a sample.
            priorities: one value per key (a numpy array or a tensor).

        Returns:
            How many transitions were updated.

        Raises:
            InvalidArgumentError: for keys not of this buffer, a length mismatch or
                values that are not finite.
        """
        if isinstance(priorities, th.Tensor):
            priorities = priorities.detach().cpu().numpy()
        values = np.abs(np.asarray(priorities, dtype=np.float64).reshape(-1)) + self.eps
        keys = np.asarray(keys).reshape(-1)
        if len(values) != len(keys) or not np.isfinite(values).all():
            raise InvalidArgumentError(
                f"priorities={describe(priorities)} must hold one finite value per key "
                f"({len(keys)} keys)"
            )
        updated = self._ring.table.update_priorities(keys, values)
        self._samples_before_update = None
        return updated

    @property
    def stale_updates(self) -> int:
        """Priority updates skipped so far because their transition had been replaced."""
        return self._ring.table.info().stale_updates


class PrioritizedReplayBuffer(_Prioritized, ReplayBuffer):
    """Prioritized experience replay (Schaul et al. 2016) with SB3's buffer interface.

    Args (besides :class:`ReplayBuffer`'s):
        alpha: priority exponent (0: uniform).
        beta: importance-weight exponent at the start; moved linearly to ``final_beta``
            as ``progress`` goes from 0 to 1.
        final_beta: the exponent at the end of training.
        eps: added to ``|TD error|`` to make a priority.
        n_steps, gamma: n-step returns as :class:`NStepReplayBuffer` (``n_steps=1``: off).

    New transitions get the largest priority seen so far. Stale priority updates (for
    transitions replaced since they were sampled) are skipped and counted in
    ``stale_updates``. ``table`` is the rlreplay table whose items are the transitions.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        final_beta: float = 1.0,
        eps: float = 1e-6,
        n_steps: int = 1,
        gamma: float = 0.99,
    ):
        self.alpha = _check_unit("alpha", alpha)
        self._setup_priorities(beta, final_beta, eps)
        if self.alpha == 0:  # uniform by choice: nothing to warn about
            self._samples_before_update = None
        ReplayBuffer.__init__(
            self,
            buffer_size,
            observation_space,
            action_space,
            device,
            n_envs,
            optimize_memory_usage,
            handle_timeout_termination,
            n_steps=n_steps,
            gamma=gamma,
        )


class PrioritizedDictReplayBuffer(_Prioritized, DictReplayBuffer):
    """:class:`PrioritizedReplayBuffer` for dict observations."""

    __init__ = PrioritizedReplayBuffer.__init__  # type: ignore[assignment]
    sample = _Prioritized.sample  # type: ignore[assignment]
