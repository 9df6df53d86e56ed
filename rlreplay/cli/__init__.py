"""The ``rlreplay`` command line: one function per subcommand (see docs/command_line.md).

A user error is one line on stderr; exit status 0 on success, 2 when the command cannot
run as given, 1 when the server cannot be reached or fails. To add a subcommand, write
``add_<name>_parser(subparsers)`` and ``cmd_<name>(args)`` and list it in ``SUBCOMMANDS``.
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
    """rlreplay's log lines at INFO (DEBUG with ``--verbose``), other libraries' at WARNING, so
    they never break the progress bar or a command's output."""
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
