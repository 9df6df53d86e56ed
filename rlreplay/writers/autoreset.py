"""gymnasium 1.x vector-env autoreset modes, as the adders see them: ``"next_step"`` (the step
after an episode end returns the reset observation) and ``"same_step"`` (the final
observation is in ``info["final_obs"]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe

AUTORESET_MODES = ("next_step", "same_step")


def mode_name(mode: Any) -> str:
    """Our name for ``mode`` (ours or gymnasium's ``AutoresetMode``); InvalidArgumentError else."""
    value = getattr(mode, "value", mode)
    key = str(value).lower().replace("-", "_")
    key = {"nextstep": "next_step", "samestep": "same_step"}.get(key, key)
    if key not in AUTORESET_MODES:
        raise InvalidArgumentError(
            f"autoreset_mode={describe(mode)} is not supported; choose one of {AUTORESET_MODES}"
            " (gymnasium's AutoresetMode.NEXT_STEP or SAME_STEP)"
        )
    return key


FINAL_OBS_KEYS = ("final_obs", "final_observation")


def final_obs_source(mode: str, info: Any, any_ended: bool) -> Any:
    """The true final observations of a step's ended episodes, or ``None`` when ``next_obs``
    holds them; InvalidArgumentError for a non-dict ``info`` or an env in the other autoreset
    mode (it would store reset observations as final ones).

    Args:
        mode: the adder's mode, ``"next_step"`` or ``"same_step"``.
        info: the step's info dict (or ``None``).
        any_ended: whether an episode of the step ended.
    """
    if info is None or (type(info) is dict and not info):
        key = None
    elif not isinstance(info, Mapping):
        raise InvalidArgumentError(f"info={describe(info)} must be the step's info dict or None")
    else:
        key = next((k for k in FINAL_OBS_KEYS if k in info), None)
    if mode == "next_step":
        if key is not None and any_ended:
            raise InvalidArgumentError(
                f"info carries {key!r} for an episode that ended: the environment autoresets "
                "in the same step (gymnasium's AutoresetMode.SAME_STEP), so next_obs holds "
                "reset observations, not final ones; create the adder with "
                "autoreset_mode='same_step' (or make the env with autoreset_mode="
                "AutoresetMode.NEXT_STEP)"
            )
        return None
    if not any_ended:
        return None
    if key is None:
        raise InvalidArgumentError(
            "autoreset_mode='same_step' reads the true final observation of an episode that "
            "ended from info['final_obs'], and info has none: pass info= from env.step, or, "
            "if the environment autoresets on the next step (gymnasium's default "
            "AutoresetMode.NEXT_STEP), create the adder with autoreset_mode='next_step'"
        )
    return info[key]
