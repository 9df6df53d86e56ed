"""The ``rlreplay`` command line: one function per subcommand.

    rlreplay demo [--seconds S] [--samples-per-insert R] [--batch-size B]
    rlreplay serve --config tables.toml [--bind ADDR] [--port N] [--insecure]
                   [--curve-secret FILE] [--authorized-keys DIR] [--metrics-port N]
    rlreplay info ADDRESS [--server-key FILE] [--client-key FILE]
    rlreplay keygen DIR [--name NAME]

To add a subcommand, write a parser function (``add_<name>...(subparsers)``) and
``cmd_<name>(args)`` and list the parser function in ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any


# ------------------------------------------------------------------- demo
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


# ------------------------------------------------------------------ serve
def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve tables from a TOML configuration")
    p.add_argument("--config", required=True, help="tables.toml (see rlreplay.net.config)")
    p.add_argument("--bind", default="127.0.0.1", help="host or ipc:///path (default loopback)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    p.add_argument("--insecure", action="store_true", help="allow non-loopback without CURVE")
    p.add_argument("--curve-secret", default=None, help="server .key_secret from keygen")
    p.add_argument("--authorized-keys", default=None, help="folder of client public .key files")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus metrics port")
    p.set_defaults(func=cmd_serve)


def load_toml(path: str) -> dict:
    """Parse a TOML file (tomllib on Python 3.11+, tomli before)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def cmd_serve(args: argparse.Namespace) -> int:
    from rlreplay.net import Server, tables_from_config

    tables = tables_from_config(load_toml(args.config))
    server = Server(
        tables,
        port=args.port,
        bind=args.bind,
        curve_secret_key=args.curve_secret,
        authorized_keys=args.authorized_keys,
        insecure=args.insecure,
        metrics_port=args.metrics_port,
    )

    def stop(signum: int, frame: Any) -> None:
        logging.getLogger("rlreplay.net").info("signal %d: stopping", signum)
        server.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.start()
    print(f"serving {', '.join(t.name for t in tables)} on {server.address}", flush=True)
    server.wait()
    server.stop()
    return 0


# ------------------------------------------------------------------- info
def add_info_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="print every table of a running server")
    p.add_argument("address", help="tcp://host:port, host:port or ipc:///path")
    p.add_argument("--server-key", default=None, help="server public .key (CURVE servers)")
    p.add_argument("--client-key", default=None, help="client .key_secret (CURVE servers)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the server")
    p.set_defaults(func=cmd_info)


INFO_COLUMNS = (
    ("table", "name", "{}"),
    ("size", "size", "{}"),
    ("capacity", "max_size", "{}"),
    ("sampler", "sampler", "{}"),
    ("remover", "remover", "{}"),
    ("inserts/s", "inserts_per_s", "{:.1f}"),
    ("samples/s", "samples_per_s", "{:.1f}"),
    ("spi", "samples_per_insert", "{:.3g}"),
    ("ins blocked s", "insert_blocked_s", "{:.2f}"),
    ("smp blocked s", "sample_blocked_s", "{:.2f}"),
)


def format_info(stats: dict[str, dict]) -> str:
    """A text table of ``Client.server_info()`` output, then each table's limiter."""
    rows = [[h for h, _, _ in INFO_COLUMNS]]
    for info in stats.values():
        rows.append([fmt.format(info[key]) for _, key, fmt in INFO_COLUMNS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for name, info in stats.items():
        lim = ", ".join(f"{k}={v:g}" for k, v in info["rate_limiter"].items())
        lines.append(f"{name}: limiter({lim}) inserts={info['inserts']} samples={info['samples']}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from rlreplay.errors import ReplayError
    from rlreplay.net import Client

    client = Client(
        args.address,
        server_public_key=args.server_key,
        client_secret_key=args.client_key,
        call_timeout=args.timeout,
    )
    try:
        print(format_info(client.server_info()))
    except ReplayError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


# ----------------------------------------------------------------- keygen
def add_keygen_parser(sub: Any) -> None:
    p = sub.add_parser("keygen", help="write a CURVE key pair (NAME.key, NAME.key_secret)")
    p.add_argument("folder", help="folder to write the keys to")
    p.add_argument("--name", default="server", help="file name stem (default: server)")
    p.set_defaults(func=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    from rlreplay.net.auth import keygen

    public, secret = keygen(args.folder, args.name)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


# ------------------------------------------------------------------- main
SUBCOMMANDS = (add_demo, add_serve_parser, add_info_parser, add_keygen_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlreplay", description="rlreplay command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlreplay`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    from rlreplay.errors import InvalidArgumentError

    try:
        return int(args.func(args) or 0)
    except InvalidArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
