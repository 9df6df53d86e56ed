"""Stable-Baselines3 and CleanRL on rlreplay: drop-in replay buffers and prioritized
algorithms (install with ``pip install "rlreplay[sb3]"``).

* :class:`ReplayBuffer`, :class:`DictReplayBuffer`, :class:`NStepReplayBuffer`: SB3's
  buffers of the same names (subclasses), each observation stored once, timeouts and
  dict observations included; pass one as ``replay_buffer_class=`` to ``DQN``, ``SAC``,
  ``TD3`` or ``DDPG``, or build it as CleanRL does.
* :class:`PrioritizedReplayBuffer`, :class:`PrioritizedDictReplayBuffer`: prioritized
  replay with importance weights and ``update_priorities``.
* :class:`PrioritizedDQN`, :class:`PrioritizedSAC`, :class:`PrioritizedTD3`,
  :class:`PrioritizedDDPG`: SB3's algorithms whose critic loss is weighted by the
  importance weights and whose ``|TD error|`` goes back as priorities
  (:class:`PrioritizedMixin`).

See docs/sb3_cleanrl.md.
"""

try:
    import stable_baselines3  # noqa: F401
except ModuleNotFoundError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rlreplay.integrations.sb3 needs Stable-Baselines3 (and torch); install it with "
        "python -m pip install 'rlreplay[sb3]'"
    ) from error

from rlreplay.integrations.sb3.algorithms import (
    PrioritizedDDPG,
    PrioritizedDQN,
    PrioritizedMixin,
    PrioritizedSAC,
    PrioritizedTD3,
)
from rlreplay.integrations.sb3.buffers import (
    DictReplayBuffer,
    NStepReplayBuffer,
    PrioritizedDictReplayBuffer,
    PrioritizedDictReplayBufferSamples,
    PrioritizedReplayBuffer,
    PrioritizedReplayBufferSamples,
    ReplayBuffer,
    observation_fields,
)

__all__ = [
    "DictReplayBuffer",
    "NStepReplayBuffer",
    "PrioritizedDDPG",
    "PrioritizedDQN",
    "PrioritizedDictReplayBuffer",
    "PrioritizedDictReplayBufferSamples",
    "PrioritizedMixin",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferSamples",
    "PrioritizedSAC",
    "PrioritizedTD3",
    "ReplayBuffer",
    "observation_fields",
]
