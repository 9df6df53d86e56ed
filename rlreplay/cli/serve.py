"""``rlreplay serve`` (tables from a TOML configuration) and ``rlreplay keygen`` (CURVE keys).

``--checkpoint-dir DIR`` restores the newest valid checkpoint at start, saves one every
``--checkpoint-every S`` seconds and keeps the newest ``--keep K``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
from typing import Any

from rlreplay.cli.parsing import CommandError, port_number, positive, size_bytes
from rlreplay.cli.remote import check_key_files, import_net


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve tables from a TOML configuration")
    p.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="tables.toml (see rlreplay.net.server.config)",
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
    add_checkpoint_flags(p)
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
    """Refuse with CommandError, naming the flags, a bad ``--bind``, a public bind without keys,
    keys without CURVE, and ``--metrics-port`` without the metrics extra."""
    from rlreplay.net.wire import auth

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
    from rlreplay.net.server.config import load_config

    check_serve_options(args)
    checkpointing = checkpoint_kwargs(args)
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
        **checkpointing,
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


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
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


def checkpoint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The Server keyword arguments of the checkpoint flags; CommandError for
    ``--checkpoint-every`` or ``--keep`` without ``--checkpoint-dir``."""
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


def add_keygen_parser(sub: Any) -> None:
    p = sub.add_parser("keygen", help="write a CURVE key pair (NAME.key, NAME.key_secret)")
    p.add_argument("folder", metavar="DIR", help="folder to write the keys to (created if missing)")
    p.add_argument(
        "--name", default="server", metavar="NAME", help="file name stem, e.g. server or client"
    )
    p.set_defaults(func=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    import_net("keygen")
    from rlreplay.net.wire.auth import keygen

    public, secret = keygen(args.folder, args.name)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0
