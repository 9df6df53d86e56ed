"""The ``rlreplay`` command line: one function per subcommand.

    rlreplay demo [--agent dqn|sac|ppo|apex] [--seed N] [--total-steps N]
                  [--backend inline|threads|processes|ray] [--out DIR]
    rlreplay serve --config tables.toml [--bind HOST] [--port N] [--insecure]
                   [--curve-secret FILE] [--authorized-keys DIR] [--metrics-port N]
                   [--max-message-bytes SIZE] [--max-unread-bytes SIZE]
                   [--max-parked-per-client N] [--parked-expiry-s S]
                   [--checkpoint-dir DIR [--checkpoint-every S] [--keep K]]
    rlreplay checkpoint ADDRESS [--timeout S] [--server-key FILE] [--client-key FILE]
    rlreplay info ADDRESS [TABLE] [--server-key FILE] [--client-key FILE] [--timeout S]
    rlreplay info --build
    rlreplay export CHECKPOINT (--npz FILE | --minari DATASET_ID) [--tables NAME,...]
    rlreplay keygen DIR [--name NAME]
    rlreplay --version

A user error is answered in one line on stderr (``rlreplay SUBCOMMAND: error: ...``),
never with a traceback. Exit status: 0 on success; 2 when the command cannot run as
given (a bad option or argument, an unknown table, a missing or malformed configuration,
a port in use, a missing extra); 1 when the server cannot be reached or fails.

To add a subcommand, write a parser function (``add_<name>_parser(subparsers)``) and
``cmd_<name>(args)`` and list the parser function in ``SUBCOMMANDS``. The subcommands
live in :mod:`rlreplay.cli.demo`, :mod:`rlreplay.cli.serve` (``serve``, ``keygen``),
:mod:`rlreplay.cli.remote` (``info``, ``checkpoint``) and :mod:`rlreplay.cli.export`;
argument parsing in :mod:`rlreplay.cli.parsing`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from rlreplay.cli import demo, export, remote, serve
from rlreplay.cli.parsing import USAGE, CommandError, Parser
from rlreplay.cli.remote import FAILED

SUBCOMMANDS = (
    demo.add_demo_parser,
    serve.add_serve_parser,
    remote.add_info_parser,
    remote.add_checkpoint_parser,
    export.add_export_parser,
    serve.add_keygen_parser,
)


def build_parser() -> argparse.ArgumentParser:
    import rlreplay

    parser = Parser(prog="rlreplay", description="rlreplay command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"rlreplay {rlreplay.__version__}")
    # required is checked by Parser.parse_command, after unknown options
    sub = parser.add_subparsers(dest="command", required=False, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def configure_logging(verbose: bool) -> None:
    """rlreplay's own log lines at INFO (DEBUG with ``--verbose``), every other library's
    at WARNING: the root logger is not lowered, so matplotlib's, torch's or any library's
    INFO lines never break the demo's progress bar or a command's output."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("rlreplay").setLevel(logging.DEBUG if verbose else logging.INFO)


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Print ``message`` as one line on stderr; returns ``code``."""
    line = " ".join(str(message).split())
    print(f"rlreplay {args.command}: error: {line}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlreplay`` command; returns the exit status (see the module)."""
    args = build_parser().parse_command(argv)
    configure_logging(args.verbose)
    from rlreplay.errors import InvalidArgumentError, ReplayError

    try:
        return int(args.func(args) or 0)
    except CommandError as exc:
        return fail(args, str(exc), exc.code)
    except InvalidArgumentError as exc:
        return fail(args, str(exc), USAGE)
    except ReplayError as exc:
        return fail(args, f"{type(exc).__name__}: {exc}", FAILED)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader left early (`rlreplay info ... | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return FAILED
