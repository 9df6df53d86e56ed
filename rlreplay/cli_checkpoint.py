"""Checkpoints on the command line: ``rlreplay serve``'s checkpoint flags, and
``rlreplay checkpoint ADDRESS``.

    rlreplay serve --config tables.toml --checkpoint-dir DIR [--checkpoint-every S] [--keep K]
    rlreplay checkpoint ADDRESS [--timeout S] [--server-key FILE] [--client-key FILE]

``serve`` restores the newest valid checkpoint in ``DIR`` at start (and says so), saves
one every ``S`` seconds while serving and keeps the newest ``K``. ``checkpoint`` asks a
running server to save one now and prints its directory once it is published.
"""

from __future__ import annotations

import argparse
from typing import Any

from rlreplay.cli_args import CommandError, positive
from rlreplay.cli_remote import add_key_flags, call_server


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """The checkpoint flags of ``rlreplay serve``."""
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="DIR",
        help="restore the newest valid checkpoint in DIR at start, and save checkpoints there",
    )
    p.add_argument(
        "--checkpoint-every",
        type=positive(float),
        default=None,
        metavar="S",
        help="seconds between checkpoints (needs --checkpoint-dir; default: only when asked "
        "by `rlreplay checkpoint`)",
    )
    p.add_argument(
        "--keep",
        type=positive(int),
        default=None,
        metavar="K",
        help="keep only the K newest checkpoints (needs --checkpoint-dir; default: all)",
    )


def serve_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The Server keyword arguments of the checkpoint flags.

    Raises:
        CommandError: for ``--checkpoint-every`` or ``--keep`` without ``--checkpoint-dir``.
    """
    if args.checkpoint_dir is None:
        given = [f for f, v in (("--checkpoint-every", args.checkpoint_every),
                                ("--keep", args.keep)) if v is not None]  # fmt: skip
        if given:
            raise CommandError(
                f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --checkpoint-dir "
                "DIR (where checkpoints are saved)"
            )
        return {}
    return {
        "checkpoint_dir": args.checkpoint_dir,
        "checkpoint_every_s": args.checkpoint_every,
        "keep_checkpoints": args.keep,
    }


def add_checkpoint_parser(sub: Any) -> None:
    p = sub.add_parser(
        "checkpoint", help="have a running server save a checkpoint now; prints its directory"
    )
    p.add_argument("address", metavar="ADDRESS", help="tcp://host:port, host:port or ipc:///path")
    p.add_argument(
        "--timeout",
        type=positive(float),
        default=600.0,
        metavar="S",
        help="seconds to wait for the checkpoint to be published",
    )
    add_key_flags(p)
    p.set_defaults(func=cmd_checkpoint)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    path = call_server(args, "checkpoint", lambda client: client.checkpoint(timeout=args.timeout))
    print(path)
    return 0
