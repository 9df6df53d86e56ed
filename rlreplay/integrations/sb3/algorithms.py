"""Prioritized variants of SB3's off-policy algorithms through one small mixin.

SB3's ``train()`` methods (DQN, SAC, TD3 and DDPG, which is TD3's) each compute their
critic loss with one call of ``torch.nn.functional`` (``F.smooth_l1_loss`` for DQN,
``F.mse_loss`` per critic for the others), with the default ``"mean"`` reduction over a
``[batch, 1]`` pair of current and target Q-values; nothing else in them calls those
functions. :class:`PrioritizedMixin` keeps SB3's ``train()`` unchanged and, while it
runs, has those calls (through a stand-in for ``F`` in the algorithm's module that
passes every other use through) compute the loss per transition, weight it with the
sampled batch's importance weights, and note ``|current - target|``. The noted TD
errors go back as priorities (averaged over the critics) before the next batch is drawn
and when ``train()`` returns.

Outside a prioritized ``train()`` (other threads, other algorithms, a buffer that is not
prioritized) the stand-in calls ``torch.nn.functional`` itself: nothing changes.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, ClassVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import DDPG, DQN, SAC, TD3
from torch.nn import functional as torch_functional

from rlreplay.integrations.sb3.buffers import (
    PrioritizedDictReplayBuffer,
    PrioritizedReplayBuffer,
)

__all__ = [
    "PrioritizedDDPG",
    "PrioritizedDQN",
    "PrioritizedMixin",
    "PrioritizedSAC",
    "PrioritizedTD3",
]

_active = threading.local()  # .batch: the _Batch of the train() running in this thread


class _Batch:
    """The importance weights of the batch being trained on and its TD errors so far."""

    def __init__(self, buffer: Any):
        self.buffer = buffer
        self.keys: np.ndarray | None = None
        self.weights: th.Tensor | None = None
        self.errors: list[th.Tensor] = []

    def flush(self) -> None:
        """Send the noted TD errors (mean over critics) back as priorities."""
        if self.keys is not None and self.errors:
            error = th.stack(self.errors).mean(dim=0)
            self.buffer.update_priorities(self.keys, error.cpu().numpy())
        self.keys, self.weights, self.errors = None, None, []

    def weighted(
        self, name: str, input: th.Tensor, target: th.Tensor, args: tuple, kwargs: dict
    ) -> th.Tensor | None:
        """The weighted loss, or ``None`` when the call is not a critic loss on this
        batch (then the caller computes it as torch would)."""
        weights = self.weights
        if (
            weights is None
            or args
            or kwargs.get("reduction", "mean") != "mean"
            or set(kwargs) - {"reduction"}
            or input.shape != target.shape
            or input.dim() < 1
            or input.shape[0] != weights.shape[0]
        ):
            return None
        per_item = getattr(torch_functional, name)(input, target, reduction="none")
        per_item = per_item.reshape(input.shape[0], -1)
        self.errors.append((input - target).detach().abs().reshape(input.shape[0], -1).mean(1))
        return (per_item * weights.reshape(-1, 1)).mean()


class _Functional:
    """Stands in for ``torch.nn.functional`` in an SB3 algorithm's module: the critic
    losses of a prioritized ``train()`` are weighted, everything else is torch's."""

    LOSSES = ("mse_loss", "smooth_l1_loss", "huber_loss", "l1_loss")

    def __init__(self, functional: Any):
        self._functional = functional

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._functional, name)
        if name not in self.LOSSES:
            return value

        def loss(input: th.Tensor, target: th.Tensor, *args: Any, **kwargs: Any) -> th.Tensor:
            batch = getattr(_active, "batch", None)
            if batch is not None:
                out = batch.weighted(name, input, target, args, kwargs)
                if out is not None:
                    return out
            return value(input, target, *args, **kwargs)

        return loss


def _install(module_name: str) -> None:
    """Put the stand-in for ``F`` into an algorithm's module (once)."""
    module = sys.modules[module_name]
    functional = getattr(module, "F", None)
    if functional is not None and not isinstance(functional, _Functional):
        module.F = _Functional(functional)


class _TrackedSampler:
    """Wraps the buffer's ``sample`` during ``train()``: before each new batch the
    previous batch's TD errors go back; the new batch's weights become current."""

    def __init__(self, batch: _Batch):
        self.batch = batch
        self.sample = batch.buffer.sample

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.batch.flush()
        samples = self.sample(*args, **kwargs)
        self.batch.keys, self.batch.weights = samples.keys, samples.weights
        return samples


class PrioritizedMixin:
    """Prioritized replay for an SB3 off-policy algorithm: put it before the algorithm
    (``class PrioritizedDQN(PrioritizedMixin, DQN)``).

    With ``replay_buffer_class`` left ``None`` the algorithm gets a
    :class:`PrioritizedReplayBuffer` (:class:`PrioritizedDictReplayBuffer` for dict
    observations) with its ``n_steps`` and ``gamma``; ``replay_buffer_kwargs`` passes
    ``alpha``, ``beta``, ``final_beta`` and ``eps``. While ``train()`` runs, the critic
    loss is weighted by the batch's importance weights and ``|TD error|`` goes back to
    the buffer; ``beta`` follows the training progress. With a buffer that is not
    prioritized the algorithm trains exactly as its SB3 original.
    """

    _train_module: ClassVar[str]
    replay_buffer: Any
    replay_buffer_class: Any
    replay_buffer_kwargs: dict[str, Any]
    observation_space: spaces.Space
    n_steps: int
    gamma: float
    _current_progress_remaining: float

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__mro__:
            if base is not cls and "train" in vars(base) and base is not PrioritizedMixin:
                cls._train_module = vars(base)["train"].__module__
                break

    def _setup_model(self) -> None:
        chosen = self.replay_buffer_class is None
        if chosen:
            is_dict = isinstance(self.observation_space, spaces.Dict)
            self.replay_buffer_class = (
                PrioritizedDictReplayBuffer if is_dict else PrioritizedReplayBuffer
            )
            if self.n_steps > 1:
                self.replay_buffer_kwargs.setdefault("n_steps", self.n_steps)
                self.replay_buffer_kwargs.setdefault("gamma", self.gamma)
        with warnings.catch_warnings():
            if chosen:  # the n-step returns were handed to the buffer just above
                warnings.filterwarnings("ignore", message=r"`n_steps=\d+` is ignored")
            super()._setup_model()  # type: ignore[misc]

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        buffer = self.replay_buffer
        if not hasattr(buffer, "update_priorities"):
            return super().train(gradient_steps, batch_size)  # type: ignore[misc]
        _install(self._train_module)
        buffer.progress = 1.0 - float(self._current_progress_remaining)
        batch = _Batch(buffer)
        outer = getattr(_active, "batch", None)
        _active.batch = batch
        buffer.sample = _TrackedSampler(batch)
        try:
            super().train(gradient_steps, batch_size)  # type: ignore[misc]
            batch.flush()
        finally:
            del buffer.sample
            _active.batch = outer


class PrioritizedDQN(PrioritizedMixin, DQN):
    """SB3's DQN with prioritized replay (importance-weighted Huber loss)."""


class PrioritizedSAC(PrioritizedMixin, SAC):
    """SB3's SAC with prioritized replay (importance-weighted critic losses)."""


class PrioritizedTD3(PrioritizedMixin, TD3):
    """SB3's TD3 with prioritized replay (importance-weighted critic losses)."""


class PrioritizedDDPG(PrioritizedMixin, DDPG):
    """SB3's DDPG with prioritized replay (importance-weighted critic loss)."""
