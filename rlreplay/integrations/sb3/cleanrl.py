"""Run a CleanRL script with rlreplay's buffers, without editing it.

Usage::

    python -m rlreplay.integrations.sb3.cleanrl cleanrl/dqn.py --seed 1 --total-timesteps 50000
    python -m rlreplay.integrations.sb3.cleanrl --prioritized cleanrl/dqn.py ...

Before the script runs, ``cleanrl_utils.buffers.ReplayBuffer`` and
``stable_baselines3.common.buffers.ReplayBuffer`` (the two places CleanRL's scripts take
their buffer from) resolve to :class:`rlreplay.integrations.sb3.ReplayBuffer` in this
process; the script then runs as ``__main__`` with the remaining arguments. With
``--prioritized`` they resolve to :class:`PrioritizedReplayBuffer` instead; its samples
carry ``weights`` and ``keys``, which an unchanged script ignores (it then samples by
priority without correcting for it, and the priorities stay at their initial values
unless the script calls ``rb.update_priorities(data.keys, td_error)``).
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import types

from rlreplay.integrations.sb3 import buffers as rlreplay_buffers


def install(buffer_class: type = rlreplay_buffers.ReplayBuffer) -> None:
    """Make ``cleanrl_utils.buffers.ReplayBuffer`` and SB3's
    ``stable_baselines3.common.buffers.ReplayBuffer`` name ``buffer_class`` in this
    process (SB3's algorithms pick their default buffer elsewhere and are unaffected)."""
    import stable_baselines3.common.buffers as sb3_buffers

    sb3_buffers.ReplayBuffer = buffer_class  # type: ignore[misc]
    try:
        module = importlib.import_module("cleanrl_utils.buffers")
    except ModuleNotFoundError:
        if "cleanrl_utils" not in sys.modules:
            try:
                importlib.import_module("cleanrl_utils")
            except ModuleNotFoundError:
                package = types.ModuleType("cleanrl_utils")
                package.__path__ = []
                sys.modules["cleanrl_utils"] = package
        module = types.ModuleType("cleanrl_utils.buffers")
        sys.modules["cleanrl_utils.buffers"] = module
        sys.modules["cleanrl_utils"].buffers = module  # type: ignore[attr-defined]
    module.ReplayBuffer = buffer_class  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    buffer_class: type = rlreplay_buffers.ReplayBuffer
    if args and args[0] == "--prioritized":
        buffer_class = rlreplay_buffers.PrioritizedReplayBuffer
        args = args[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return
    if not args or args[0].startswith("-"):
        raise SystemExit(__doc__)
    if not os.path.isfile(args[0]):
        raise SystemExit(f"cleanrl: error: the script {args[0]!r} does not exist")
    install(buffer_class)
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
