"""Reaching a running server from the command line: ``rlreplay info`` and ``rlreplay
checkpoint``, with key-file checks and one-line errors.
"""

from __future__ import annotations

import argparse
import importlib
import os
from types import ModuleType
from typing import Any

from rlreplay.cli.parsing import CommandError, positive

FAILED = 1  # it ran, and the server (or the operation) failed
NET_MODULES = ("zmq", "msgpack", "tomli")


def check_key_files(**flags: str | None) -> None:
    """Refuse, naming the flag, a key file path that is not a file (CommandError)."""
    for name, path in flags.items():
        if path is not None and not os.path.isfile(path):
            flag = "--" + name.replace("_", "-")
            missing = "is a folder, not a key file" if os.path.isdir(path) else "does not exist"
            raise CommandError(
                f"{flag} {path}: the file {missing}; give a key file written by "
                "`rlreplay keygen DIR` (NAME.key is public, NAME.key_secret secret)"
            )


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


def add_key_flags(parser: argparse.ArgumentParser) -> None:
    """The key flags of a command that reaches a server, as :func:`call_server` reads them."""
    parser.add_argument(
        "--server-key", default=None, metavar="FILE", help="server public .key (CURVE servers)"
    )
    parser.add_argument(
        "--client-key", default=None, metavar="FILE", help="client .key_secret (CURVE servers)"
    )


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
    add_key_flags(p)
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


# ``info`` diagnoses unreachable servers, so it watches a failed handshake longer.
INFO_DIAGNOSE_S = 2.0

# The command's flags, named in the reasons a server could not be reached.
CREDENTIAL_FLAGS = {
    "server_key": "--server-key",
    "server_key_example": "--server-key SERVER.key",
    "client_key": "--client-key",
    "client_key_example": "--client-key CLIENT.key_secret",
    "authorized_keys": "--authorized-keys",
}


def why_unreachable(args: argparse.Namespace, error: Exception) -> str:
    """One line on why ``info`` got no reply, naming this command's flags."""
    from rlreplay.net.wire import auth

    why = auth.unreachable_reason(getattr(error, "reason", None), CREDENTIAL_FLAGS)
    if why is not None:
        return f"cannot query the replay server at {args.address}: {why}"
    return f"{type(error).__name__}: {error}"


def call_server(args: argparse.Namespace, command: str, call: Any, **client_args: Any) -> Any:
    """``call(client)`` on a client of the server at ``args.address``, closed afterwards; raises
    CommandError for a missing key file, an unreachable or restarted server (exit status
    ``FAILED``), or an address ZeroMQ refuses."""
    net = import_net(command)
    import zmq

    from rlreplay.errors import ServerRestartedError, ServerUnavailableError

    check_key_files(server_key=args.server_key, client_key=args.client_key)
    client = net.Client(
        args.address,
        server_public_key=args.server_key,
        client_secret_key=args.client_key,
        diagnose_timeout=INFO_DIAGNOSE_S,
        **client_args,
    )
    try:
        return call(client)
    except ServerRestartedError as exc:
        why = f"the server restarted during `rlreplay {command}`: {exc}"
        raise CommandError(why, FAILED) from None
    except ServerUnavailableError as exc:
        raise CommandError(why_unreachable(args, exc), FAILED) from None
    except zmq.ZMQError as exc:
        raise CommandError(f"cannot connect to {args.address}: {exc}") from None
    finally:
        client.close()


def cmd_info(args: argparse.Namespace) -> int:
    if args.build and args.address is not None:
        given = " ".join(a for a in (args.address, args.table) if a is not None)
        raise CommandError(
            f"--build takes no ADDRESS or TABLE (got {given!r}): run `rlreplay info --build` "
            "and `rlreplay info ADDRESS` separately"
        )
    if args.build:
        print(format_build())
    if args.address is None:
        if args.build:
            return 0
        raise CommandError("give the server's ADDRESS (tcp://host:port), or --build")
    stats = call_server(
        args, "info", lambda client: client.server_info(args.table), call_timeout=args.timeout
    )
    print(format_info(stats))
    return 0


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


def format_columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells as left-aligned text columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def format_info(stats: dict[str, dict]) -> str:
    """A text table of ``Client.server_info()`` output, then each table's limiter."""
    rows = [[h for h, _, _ in INFO_COLUMNS]]
    for info in stats.values():
        rows.append([fmt.format(info[key]) for _, key, fmt in INFO_COLUMNS])
    lines = format_columns(rows)
    for name, info in stats.items():
        lim = ", ".join(f"{k}={v:g}" for k, v in info["rate_limiter"].items())
        lines.append(f"{name}: limiter({lim}) inserts={info['inserts']} samples={info['samples']}")
    return "\n".join(lines)


def format_build() -> str:
    """The package version and whether each compiled kernel is active, and why not."""
    import platform

    import numpy as np

    import rlreplay
    from rlreplay.core._compiled import kernel_status

    rows = [["kernel", "active", "why"]]
    for status in kernel_status():
        rows.append([status.module, "yes" if status.active else "no", status.reason])
    header = (
        f"rlreplay {rlreplay.__version__} (Python {platform.python_version()}, "
        f"numpy {np.__version__})"
    )
    return "\n".join([header, *format_columns(rows)])
