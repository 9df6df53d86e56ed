"""The ``rlreplay`` command line: one function per subcommand."""

from __future__ import annotations

import argparse
import sys


def cmd_demo(args: argparse.Namespace) -> int:
    from rlreplay.demo import run_demo

    run_demo(
        seconds=args.seconds,
        samples_per_insert=args.samples_per_insert,
        batch_size=args.batch_size,
    )
    return 0


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="actor and learner threads sharing one rate-limited table")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to run")
    p.add_argument("--samples-per-insert", type=float, default=8.0, help="ratio to hold")
    p.add_argument("--batch-size", type=int, default=64, help="learner batch size")
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlreplay", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
