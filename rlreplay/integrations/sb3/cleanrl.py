"""Run a CleanRL script with rlreplay's buffers, without editing it.

Usage::

    python -m rlreplay.integrations.sb3.cleanrl cleanrl/dqn.py --seed 1 --total-timesteps 50000
    python -m rlreplay.integrations.sb3.cleanrl --prioritized cleanrl/dqn.py ...

The script runs as ``__main__`` with the remaining arguments, and its
``from cleanrl_utils.buffers import ReplayBuffer`` and
``from stable_baselines3.common.buffers import ReplayBuffer`` (the two places CleanRL's
scripts take their buffer from) give :class:`rlreplay.integrations.sb3.ReplayBuffer`.
With ``--prioritized`` they give :class:`PrioritizedReplayBuffer` instead; its samples
carry ``weights`` and ``keys``, which an unchanged script ignores (it then samples by
priority without correcting for it, and the priorities stay at their initial values
unless the script calls ``rb.update_priorities(data.keys, td_error)``).

Only the script's own imports are redirected: SB3's modules keep their classes (SB3's
``DictReplayBuffer`` needs its own ``ReplayBuffer``), and ``cleanrl_utils`` need not be
installed.
"""

from __future__ import annotations

import builtins
import importlib
import os
import runpy
import sys
import types
from collections.abc import Sequence
from typing import Any

from rlreplay.integrations.sb3 import buffers as rlreplay_buffers

#: Modules whose ``ReplayBuffer`` a script run here gets from rlreplay.
REDIRECTED = ("cleanrl_utils.buffers", "stable_baselines3.common.buffers")


def run_script(
    path: str, argv: Sequence[str] = (), buffer_class: type = rlreplay_buffers.ReplayBuffer
) -> None:
    """Run the script at ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` and
    its folder first on ``sys.path``, as ``python path`` runs it (both are restored when
    it returns); its ``from <m> import ReplayBuffer`` for a module ``m`` in
    :data:`REDIRECTED` gives ``buffer_class`` (other names come from ``m`` itself; other
    import forms are not redirected).

    Raises:
        FileNotFoundError: if there is no file at ``path`` (nothing is changed then).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the script {path!r} does not exist")
    real_import = builtins.__import__
    views: dict[str, types.ModuleType] = {}

    def redirecting_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level or not fromlist or name not in REDIRECTED:
            return real_import(name, globals, locals, fromlist, level)
        if name not in views:
            views[name] = _view(name, buffer_class)
        return views[name]

    script_builtins = dict(vars(builtins), __import__=redirecting_import)
    argv_before, path_before = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    # as `python path` does: the script's folder first on the path (its own modules)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, init_globals={"__builtins__": script_builtins}, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv_before, path_before


def _view(name: str, buffer_class: type) -> types.ModuleType:
    """A module named ``name`` whose ``ReplayBuffer`` is ``buffer_class`` and whose other
    names are those of the installed module ``name`` (none if it is not installed)."""
    try:
        real: types.ModuleType | None = importlib.import_module(name)
    except ModuleNotFoundError:
        real = None
    view = types.ModuleType(name)
    view.ReplayBuffer = buffer_class  # type: ignore[attr-defined]

    def forward(attribute: str) -> Any:
        if real is None:
            raise AttributeError(f"module {name!r} is not installed; only ReplayBuffer is given")
        return getattr(real, attribute)

    view.__getattr__ = forward  # type: ignore[attr-defined]
    return view


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
    run_script(args[0], args[1:], buffer_class)


if __name__ == "__main__":
    main()
