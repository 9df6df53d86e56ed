"""gymnasium 1.x vector-env autoreset modes, as the adders see them.

* ``"next_step"`` (gymnasium's default): after an episode ends, the next ``step`` call
  for that environment ignores its action and returns the reset observation.
* ``"same_step"``: the observation returned with ``terminated``/``truncated`` is already
  the reset one; the true final observation is in ``info["final_obs"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.specs import flatten
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


def _flat_obs(value: Any) -> dict[str, np.ndarray]:
    if isinstance(value, Mapping):
        return {f"obs/{p}": np.asarray(v) for p, v in flatten(value).items()}
    return {"obs": np.asarray(value)}


def final_observations(
    obs: dict[str, np.ndarray], info: Mapping[str, Any] | None, ended: np.ndarray
) -> dict[str, np.ndarray]:
    """``obs`` (flat, batched) with the entries of ``ended`` environments replaced by
    ``info["final_obs"]`` (same-step autoreset).

    Raises:
        InvalidArgumentError: if ``info`` lacks ``final_obs``.
    """
    if info is None or "final_obs" not in info:
        raise InvalidArgumentError(
            "autoreset_mode='same_step' needs the step's info with 'final_obs' for "
            "environments whose episode ended; pass info= from env.step"
        )
    final = {p: a.copy() for p, a in obs.items()}
    for i in ended:
        for p, a in _flat_obs(info["final_obs"][i]).items():
            final[p][i] = a
    return final
