"""The ``rlreplay`` command line: one function per subcommand.

    rlreplay demo [--seconds S] [--samples-per-insert R] [--batch-size B]
    rlreplay serve --config tables.toml [--bind ADDR] [--port N] [--insecure]
                   [--curve-secret FILE] [--authorized-keys DIR] [--metrics-port N]
                   [--max-message-bytes N] [--max-unread-bytes N]
                   [--max-parked-per-client N] [--parked-expiry-s S]
    rlreplay info ADDRESS [TABLE] [--server-key FILE] [--client-key FILE] [--timeout S]
    rlreplay info --build
    rlreplay keygen DIR [--name NAME]
    rlreplay --version

A user error is answered in one line on stderr (``rlreplay SUBCOMMAND: error: ...``),
never with a traceback. Exit status: 0 on success; 2 when the command cannot run as
given (a bad option or argument, an unknown table, a missing or malformed configuration,
a port in use, a missing extra); 1 when the server cannot be reached or fails.

To add a subcommand, write a parser function (``add_<name>...(subparsers)``) and
``cmd_<name>(args)`` and list the parser function in ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

USAGE = 2  # the command cannot run as given
FAILED = 1  # it ran, and the server (or the operation) failed
NET_MODULES = ("zmq", "msgpack", "tomli")


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


def positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` greater than zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 (0: any free port)."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return int(text)


def import_net(command: str) -> ModuleType:
    """``rlreplay.net``, or a one-line error saying how to install the ``net`` extra."""
    try:
        return importlib.import_module("rlreplay.net")
    except ImportError as exc:
        if exc.name not in NET_MODULES:
            raise
        raise CommandError(
            f"`rlreplay {command}` needs the net extra (module {exc.name!r} is missing): "
            'pip install "rlreplay[net]"'
        ) from None


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
    p.add_argument(
        "--seconds", type=positive(float), default=10.0, metavar="S", help="how long to run"
    )
    p.add_argument("--samples-per-insert", type=positive(float), default=8.0, help="ratio to hold")
    p.add_argument("--batch-size", type=positive(int), default=64, help="learner batch size")
    p.set_defaults(func=cmd_demo)


# ------------------------------------------------------------------ serve
def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve tables from a TOML configuration")
    p.add_argument(
        "--config", required=True, metavar="FILE", help="tables.toml (see rlreplay.net.config)"
    )
    p.add_argument(
        "--bind", default="127.0.0.1", metavar="HOST", help="host to bind, or ipc:///path"
    )
    p.add_argument(
        "--port", type=port_number, default=None, metavar="N", help="TCP port (default: a free one)"
    )
    p.add_argument("--insecure", action="store_true", help="allow non-loopback without CURVE")
    p.add_argument(
        "--curve-secret", default=None, metavar="FILE", help="server .key_secret from keygen"
    )
    p.add_argument(
        "--authorized-keys", default=None, metavar="DIR", help="folder of client public .key files"
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        metavar="N",
        help="Prometheus metrics port",
    )
    for name, kind, help_text in SERVER_LIMITS:
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=positive(kind), default=None, metavar="N", help=help_text)
    p.set_defaults(func=cmd_serve)


# Per-client bounds of a server (Server keyword arguments; left out: the Server's default).
SERVER_LIMITS = (
    ("max_message_bytes", int, "largest request accepted, in bytes (default: 1 GiB)"),
    (
        "max_unread_bytes",
        int,
        "bytes of replies held for one client that does not read them; past it its requests "
        "are refused (default: 256 MiB)",
    ),
    (
        "max_parked_per_client",
        int,
        "calls of one client that may wait on rate limiters at once (default: 1000)",
    ),
    (
        "parked_expiry_s",
        float,
        "seconds of silence after which a client's calls parked without a timeout are "
        "dropped (default: 300)",
    ),
)


def check_serve_security(args: argparse.Namespace, loopback: bool) -> None:
    """Refuse, naming the flags, a public bind without keys and keys without CURVE.

    Raises:
        CommandError: for a non-loopback ``--bind`` with neither ``--curve-secret`` nor
            ``--insecure``, or ``--authorized-keys`` that is not a folder or lacks
            ``--curve-secret``.
    """
    if not loopback and args.curve_secret is None and not args.insecure:
        raise CommandError(
            f"--bind {args.bind} is not a loopback address: give --curve-secret "
            "SERVER.key_secret (keys from `rlreplay keygen DIR`) so clients must authenticate, "
            "or --insecure to serve without authentication on purpose"
        )
    if args.authorized_keys is not None:
        if args.curve_secret is None:
            raise CommandError("--authorized-keys needs --curve-secret (CURVE authentication)")
        if not os.path.isdir(args.authorized_keys):
            raise CommandError(
                f"--authorized-keys {args.authorized_keys} is not a folder of client public "
                ".key files"
            )


def cmd_serve(args: argparse.Namespace) -> int:
    net = import_net("serve")
    import zmq

    from rlreplay.net import auth
    from rlreplay.net.config import load_config

    endpoint = auth.endpoint(args.bind, args.port)
    check_serve_security(args, auth.is_loopback(endpoint))
    tables = load_config(args.config)
    server = net.Server(
        tables,
        port=args.port,
        bind=args.bind,
        curve_secret_key=args.curve_secret,
        authorized_keys=args.authorized_keys,
        insecure=args.insecure,
        metrics_port=args.metrics_port,
        **{n: getattr(args, n) for n, _, _ in SERVER_LIMITS if getattr(args, n) is not None},
    )
    try:
        server.start()
    except zmq.ZMQError as exc:
        server.stop()
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(
                f"cannot serve on {endpoint}: the address is already in use (another server?); "
                "choose another --port, or leave --port out to pick a free one"
            ) from None
        raise CommandError(f"cannot serve on {endpoint} (--bind/--port): {exc}") from None
    except OSError as exc:  # the metrics port
        server.stop()
        raise CommandError(
            f"cannot serve metrics on --metrics-port {args.metrics_port}: {exc}"
        ) from None

    def stop(signum: int, frame: Any) -> None:
        logging.getLogger("rlreplay.net").info("signal %d: stopping", signum)
        server.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"serving {', '.join(t.name for t in tables)} on {server.address}", flush=True)
    server.wait()
    server.stop()
    return 0


# ------------------------------------------------------------------- info
def add_info_parser(sub: Any) -> None:
    p = sub.add_parser(
        "info", help="print the tables of a running server, or (--build) the compiled kernels"
    )
    p.add_argument(
        "address", nargs="?", metavar="ADDRESS", help="tcp://host:port, host:port or ipc:///path"
    )
    p.add_argument(
        "table", nargs="?", metavar="TABLE", help="only this table (default: every table)"
    )
    p.add_argument(
        "--server-key", default=None, metavar="FILE", help="server public .key (CURVE servers)"
    )
    p.add_argument(
        "--client-key", default=None, metavar="FILE", help="client .key_secret (CURVE servers)"
    )
    p.add_argument(
        "--timeout",
        type=positive(float),
        default=5.0,
        metavar="S",
        help="seconds to wait for the server",
    )
    p.add_argument(
        "--build", action="store_true", help="which compiled kernels are active, and why not"
    )
    p.set_defaults(func=cmd_info)


UNREACHABLE = {
    "needs_curve": "the server uses CURVE and no credentials were given: give --server-key "
    "SERVER.key (its public key from `rlreplay keygen`), and --client-key CLIENT.key_secret "
    "if it accepts only authorized clients",
    "not_curve": "the server does not use CURVE: leave out --server-key and --client-key",
    "wrong_server_key": "the server refused the CURVE handshake: --server-key is not this "
    "server's public key",
    "client_not_authorized": "the server does not accept this client's key: give --client-key "
    "with a .key_secret whose public .key is in the server's --authorized-keys folder",
    "refused": "nothing accepts connections there: is the server running, and are the host "
    "name and the port right?",
}


def why_unreachable(args: argparse.Namespace, error: Exception) -> str:
    """One line on why ``info`` got no reply, from the connection's handshake events."""
    from rlreplay.net import auth

    verdict = auth.diagnose_connection(args.address, args.server_key, args.client_key, timeout=1.0)
    if verdict in UNREACHABLE:
        return f"cannot query the replay server at {args.address}: {UNREACHABLE[verdict]}"
    return f"{type(error).__name__}: {error}"


def cmd_info(args: argparse.Namespace) -> int:
    from rlreplay.cli_output import format_build, format_info

    if args.build:
        print(format_build())
    if args.address is None:
        if args.build:
            return 0
        raise CommandError("give the server's ADDRESS (tcp://host:port), or --build")
    net = import_net("info")
    import zmq

    from rlreplay.errors import ServerUnavailableError

    client = net.Client(
        args.address,
        server_public_key=args.server_key,
        client_secret_key=args.client_key,
        call_timeout=args.timeout,
    )
    try:
        stats = client.server_info(args.table)
    except ServerUnavailableError as exc:
        raise CommandError(why_unreachable(args, exc), FAILED) from None
    except zmq.ZMQError as exc:
        raise CommandError(f"cannot connect to {args.address}: {exc}") from None
    finally:
        client.close()
    print(format_info(stats))
    return 0


# ----------------------------------------------------------------- keygen
def add_keygen_parser(sub: Any) -> None:
    p = sub.add_parser("keygen", help="write a CURVE key pair (NAME.key, NAME.key_secret)")
    p.add_argument("folder", metavar="DIR", help="folder to write the keys to (created if missing)")
    p.add_argument(
        "--name", default="server", metavar="NAME", help="file name stem, e.g. server or client"
    )
    p.set_defaults(func=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    import_net("keygen")
    from rlreplay.net.auth import keygen

    public, secret = keygen(args.folder, args.name)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


# ------------------------------------------------------------------- main
SUBCOMMANDS = (add_demo, add_serve_parser, add_info_parser, add_keygen_parser)


def build_parser() -> argparse.ArgumentParser:
    import rlreplay

    parser = Parser(prog="rlreplay", description="rlreplay command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"rlreplay {rlreplay.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Print ``message`` as one line on stderr; returns ``code``."""
    line = " ".join(str(message).split())
    print(f"rlreplay {args.command}: error: {line}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlreplay`` command; returns the exit status (see the module)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
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


if __name__ == "__main__":
    sys.exit(main())
