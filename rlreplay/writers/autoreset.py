"""gymnasium 1.x vector-env autoreset modes, as the adders see them.

* ``"next_step"`` (gymnasium's default): after an episode ends, the next ``step`` call
  for that environment ignores its action and returns the reset observation.
* ``"same_step"``: the observation returned with ``terminated``/``truncated`` is already
  the reset one; the true final observation is in ``info["final_obs"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe

AUTORESET_MODES = ("next_step", "same_step")


def mode_name(mode: Any) -> str:
    """Our name for ``mode``: accepts our names and gymnasium's ``AutoresetMode`` members.

    Raises:
        InvalidArgumentError: for any other mode (gymnasium's ``DISABLED`` included).
    """
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
    """The true final observations of a step's ended episodes, or ``None`` when the
    step's ``next_obs`` already holds them; checks that the env's autoreset mode is the
    adder's.

    A same-step vector env (gymnasium's ``AutoresetMode.SAME_STEP``; ``final_observation``
    in gymnasium < 1.0) puts the final observations in ``info["final_obs"]`` and returns
    reset observations in their place; a next-step env (the default) returns the final
    observations and never sets ``final_obs``. Feeding one to an adder in the other mode
    would store reset observations as final ones, so a mismatch is refused.

    Args:
        mode: the adder's mode, ``"next_step"`` or ``"same_step"``.
        info: the step's info dict (or ``None``).
        any_ended: whether an episode of the step ended (terminated or truncated).

    Raises:
        InvalidArgumentError: if ``info`` is not a dict, if a next-step adder receives
            final observations in ``info`` with an ended episode, or if a same-step adder
            receives an ended episode without them.
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
