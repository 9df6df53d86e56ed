"""The ``rlreplay`` command line: one function per subcommand.

    rlreplay demo [--agent dqn|sac|ppo|apex] [--seed N] [--total-steps N]
                  [--backend inline|threads|processes] [--out DIR]
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

To add a subcommand, write a parser function (``add_<name>...(subparsers)``) and
``cmd_<name>(args)`` and list the parser function in ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from rlreplay import cli_checkpoint, cli_export, cli_remote
from rlreplay.cli_args import USAGE, CommandError, Parser, port_number, positive, size_bytes
from rlreplay.cli_remote import FAILED, check_key_files, import_net


# ------------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace) -> int:
    from rlreplay.demo import INSTALL, default_out, missing_modules, run_demo, written

    missing = missing_modules()
    if missing:
        raise CommandError(
            f"the demo trains a network and needs {missing}, which are not installed: {INSTALL}"
        )
    out = default_out(args.agent) if args.out is None else args.out
    summary = run_demo(
        args.agent, seed=args.seed, total_steps=args.total_steps, backend=args.backend,
        out=out,
    )
    target = summary.get("samples_per_insert_target")
    observed = summary.get("samples_per_insert_observed")
    ratio = (
        "on-policy: each item sampled once" if target is None
        else f"samples per insert {observed or 0:.2f} (target {target:g})"
    )
    print(
        f"done: {summary.get('env_steps')} env steps in {summary.get('wall_s') or 0:.0f}s, "
        f"final evaluation return {summary.get('final_eval_return')}, {ratio}"
    )
    print(written(out), flush=True)
    return 0


def add_demo(sub: argparse._SubParsersAction) -> None:
    from rlreplay.demo import AGENTS

    p = sub.add_parser(
        "demo", help="train an agent through replay (default: DQN on CartPole, processes)"
    )
    p.add_argument(
        "--agent", choices=sorted(AGENTS), default="dqn",
        help="; ".join(f"{name}: {what}" for name, (_, what) in AGENTS.items()),
    )
    p.add_argument("--seed", type=int, default=None, help="seed (default: the agent's)")
    p.add_argument(
        "--total-steps", type=positive(int), default=None, metavar="N",
        help="env steps to train for (default: the agent's)",
    )
    p.add_argument(
        "--backend", choices=("inline", "threads", "processes"), default=None,
        help="where actors and learner run (default: the agent's, processes)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR",
        help="folder for metrics.csv, summary.json and learning_curve.png (default: "
        "runs/<example>, e.g. runs/dqn_cartpole; '' writes nothing)",
    )
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
        help="Prometheus metrics port (needs the metrics extra)",
    )
    for name, kind, help_text in SERVER_LIMITS:
        flag = "--" + name.replace("_", "-")
        parse = size_bytes if name.endswith("_bytes") else positive(kind)
        metavar = "SIZE" if name.endswith("_bytes") else "N"
        p.add_argument(flag, type=parse, default=None, metavar=metavar, help=help_text)
    cli_checkpoint.add_serve_flags(p)
    p.set_defaults(func=cmd_serve)


# Per-client bounds of a server (Server keyword arguments; left out: the Server's default).
SERVER_LIMITS = (
    (
        "max_message_bytes",
        int,
        "largest request accepted: bytes, or a size such as 512MiB (default: 1GiB)",
    ),
    (
        "max_unread_bytes",
        int,
        "bytes of replies held for one client that does not read them (or a size such as "
        "64MiB); past it its requests are refused (default: 256MiB)",
    ),
    (
        "max_parked_per_client",
        int,
        "calls of one client that may wait on rate limiters at once (default: 1000)",
    ),
    (
        "max_writers_per_client",
        int,
        "remote trajectory writers one client keeps on the server; a new one drops the "
        "client's writer idle longest (default: 64)",
    ),
    (
        "parked_expiry_s",
        float,
        "seconds of silence after which a client's calls parked without a timeout are "
        "dropped (default: 300)",
    ),
)


def check_serve_options(args: argparse.Namespace) -> None:
    """Refuse, naming the flags, a ``--bind`` that is not a host, a public bind without
    keys, keys without CURVE, and ``--metrics-port`` without the metrics extra.

    Raises:
        CommandError: for a ``--bind`` holding a port or a ``tcp://`` URL with one, a
            non-loopback ``--bind`` with neither ``--curve-secret`` nor ``--insecure``,
            ``--authorized-keys`` that is not a folder or lacks ``--curve-secret``, or
            ``--metrics-port`` without prometheus-client.
    """
    from rlreplay.net import auth

    check_key_files(curve_secret=args.curve_secret)
    if args.metrics_port is not None:
        try:
            importlib.import_module("prometheus_client")
        except ImportError:
            raise CommandError(
                "--metrics-port needs the metrics extra (module 'prometheus_client' is "
                'missing): pip install "rlreplay[metrics]", or leave out --metrics-port'
            ) from None
    extra = auth.port_in_bind(args.bind)
    if extra is not None:
        raise CommandError(
            f"--bind {args.bind} holds more than a host ({extra!r}): --bind takes a host (or "
            "ipc:///path); give the port with --port, e.g. --bind 127.0.0.1 --port 8000"
        )
    loopback = auth.is_loopback(auth.endpoint(args.bind, args.port))
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
    from rlreplay.errors import AddressInUseError
    from rlreplay.net.config import load_config

    check_serve_options(args)
    checkpoint_kwargs = cli_checkpoint.serve_kwargs(args)
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
        **checkpoint_kwargs,
    )
    try:
        server.start()
    except AddressInUseError as exc:
        raise CommandError(
            f"cannot serve on {exc.address}: the address is already in use (another server?); "
            "choose another --port, or leave --port out to pick a free one"
        ) from None
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
    if server.checkpoints.restored_from is not None:
        print(f"restored {server.checkpoints.restored_from}", flush=True)
    print(f"serving {', '.join(t.name for t in tables)} on {server.address}", flush=True)
    server.wait()
    server.stop()
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
SUBCOMMANDS = (
    add_demo,
    add_serve_parser,
    cli_remote.add_info_parser,
    cli_checkpoint.add_checkpoint_parser,
    cli_export.add_export_parser,
    add_keygen_parser,
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


if __name__ == "__main__":
    sys.exit(main())
