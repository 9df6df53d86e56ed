"""Argument parsing of the ``rlreplay`` command line: its parser and its argument types.

Usage errors are one line on stderr with exit status 2 (:data:`USAGE`); every type names
the value it refused and what it takes instead.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NoReturn

USAGE = 2  # the command cannot run as given


class CommandError(Exception):
    """A user error the command reports in one line and exits with ``code``."""

    def __init__(self, message: str, code: int = USAGE):
        super().__init__(message)
        self.code = code


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows every default that has a value (not the ``None`` of "unset")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit status 2)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_command(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """Parse ``argv``; an unknown option is named before a missing COMMAND (argparse would
        report the missing COMMAND for a typo such as ``--versoin``)."""
        args, unknown = self.parse_known_args(argv)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command is None:
            self.error("the following arguments are required: COMMAND")
        return args


KIND_NAMES = {int: "an integer", float: "a number"}


def positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` greater than zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {KIND_NAMES[kind]}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


BYTE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}  # fmt: skip
SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def size_bytes(text: str) -> int:
    """An argparse type: a size in bytes > 0, plain or with a unit (``KiB``..``TiB`` powers of
    1024, ``KB``..``TB`` powers of 1000, any case: ``512MiB``, ``1.5GiB``)."""
    match = SIZE.fullmatch(text)
    unit = match and BYTE_UNITS.get(match.group(2).lower())
    if not unit:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes (1048576) or a number and a unit: "
            "KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB, e.g. 512MiB or 1GiB"
        )
    value = Fraction(match.group(1)) * unit
    if value != int(value) or not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of bytes, at least 1")
    return int(value)


size_bytes.__name__ = "size in bytes"


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 (0: any free port)."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return int(text)
