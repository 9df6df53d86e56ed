"""Command-line flags from a dataclass of hyperparameters, for training scripts.

Each field becomes a ``--flag`` of its default's type (a bool: ``--flag`` / ``--no-flag``);
abbreviations are refused, so a typo never silently sets another flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import math
import os
import sys
import textwrap
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.runtime.config import BACKENDS

T = TypeVar("T")


def flag(name: str) -> str:
    """The command-line flag of the field ``name``."""
    return "--" + name.replace("_", "-")


def field_docs(args_class: type) -> dict[str, str]:
    """The docstring under each field of ``args_class`` and its bases, for ``--help``."""
    docs: dict[str, str] = {}
    for cls in reversed(args_class.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for field, doc in itertools.pairwise(body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                docs[field.target.id] = " ".join(doc.value.value.split())
    return docs


def parse_flags(
    args_class: type[T], argv: list[str] | None, description: str = "", epilog: str = ""
) -> T:
    """An ``args_class`` instance from ``argv`` (``None``: ``sys.argv[1:]``).

    The first paragraph of ``description`` heads ``--help``; ``epilog`` ends it.

    Raises:
        SystemExit: for an unknown flag or a value of the wrong type.
        Whatever ``args_class`` raises for values out of range.
    """
    parser = argparse.ArgumentParser(
        description=" ".join(description.strip().split("\n\n")[0].split()),
        epilog=epilog or None,
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    docs = field_docs(args_class)
    for field in dataclasses.fields(args_class):  # type: ignore[arg-type]
        default: Any = field.default
        help_text = docs.get(field.name, " ").replace("%", "%%")  # argparse formats help
        if isinstance(default, bool):
            parser.add_argument(
                flag(field.name), action=argparse.BooleanOptionalAction, default=default,
                help=help_text,
            )
        elif field.name == "backend":
            parser.add_argument(
                flag(field.name), choices=BACKENDS, default=default, help=help_text
            )
        else:
            kind = type(default) if default is not None else str
            parser.add_argument(flag(field.name), type=kind, default=default, help=help_text)
    return args_class(**vars(parser.parse_args(argv)))


def run_script(main: Callable[[], Any]) -> None:
    """Run a script's ``main()`` and print what it returns as JSON.

    A refused flag (an ``InvalidArgumentError`` starting with the flag) or a missing extra
    (``ImportError``) ends it in one stderr line, exit status 2; other failures keep their
    traceback."""
    try:
        result = main()
    except (InvalidArgumentError, ImportError) as error:
        if isinstance(error, InvalidArgumentError) and not str(error).startswith("--"):
            raise
        print(f"{os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(result, indent=2))


def check_ranges(
    args: Any,
    *,
    counts: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    positive: Iterable[str] = (),
    fractions: Iterable[str] = (),
    open_fractions: Iterable[str] = (),
    at_most: Iterable[tuple[str, str]] = (),
) -> None:
    """Refuse hyperparameters out of range, naming the flag: ``counts`` ints >= 1,
    ``non_negative`` ints >= 0, ``positive`` finite numbers > 0, ``fractions`` in [0, 1],
    ``open_fractions`` in (0, 1], and ``a <= b`` for each ``(a, b)`` of ``at_most``.

    Raises:
        InvalidArgumentError: for the first field out of its range.
    """
    for names, least in ((counts, 1), (non_negative, 0)):
        for name in names:
            value = getattr(args, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidArgumentError(
                    f"{flag(name)}={describe(value)} must be an int >= {least}"
                )
    for name in positive:
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0.0 < value < math.inf
        ):
            raise InvalidArgumentError(f"{flag(name)}={describe(value)} must be a number > 0")
    for names, zero_ok, bounds in ((fractions, True, "[0, 1]"), (open_fractions, False, "(0, 1]")):
        for name in names:
            value = getattr(args, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            above = number and (value >= 0.0 if zero_ok else value > 0.0)
            if not (above and value <= 1.0):
                raise InvalidArgumentError(f"{flag(name)}={describe(value)} must be in {bounds}")
    for small, large in at_most:
        if getattr(args, small) > getattr(args, large):
            raise InvalidArgumentError(
                f"{flag(small)}={getattr(args, small)} must be at most "
                f"{flag(large)}={getattr(args, large)}"
            )
