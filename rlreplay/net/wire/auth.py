"""Addresses, loopback checks and ZeroMQ CURVE authentication for server and client.

The client must know the server's public key; the server accepts only client keys in its
``authorized_keys`` folder (any, when none is given). Keys come from ``rlreplay keygen``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import threading
import time
from pathlib import Path

import zmq

from rlreplay.errors import AddressInUseError, InvalidArgumentError, describe

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def normalize_address(address: str) -> str:
    """``host:port`` becomes ``tcp://host:port``; ``tcp://`` and ``ipc://`` pass through.

    Raises:
        InvalidArgumentError: for no host, a port not in [1, 65535], whitespace, or an
            ``ipc://`` address without a path.
    """
    if address is None:
        raise InvalidArgumentError(
            "address=None must be a string such as 'localhost:8000' (a Server's address "
            "is known once it is started: server.start(), or with rlreplay.Server(...) as "
            "server)"
        )
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError(
            f"address={describe(address)} must be a non-empty string such as 'localhost:8000'"
        )
    usage = "tcp://HOST:PORT, HOST:PORT or ipc:///path"
    if address.startswith("ipc://"):
        if len(address) == len("ipc://"):
            raise InvalidArgumentError(f"address={address!r} is not {usage}: no socket path")
        return address
    if not address.startswith("tcp://"):
        if ":" not in address or "/" in address:
            raise InvalidArgumentError(f"address={address!r} is not {usage}")
        address = "tcp://" + address
    host, colon, port = address[len("tcp://") :].rpartition(":")
    if any(c.isspace() for c in address):
        raise InvalidArgumentError(f"address={address!r} is not {usage}: it holds whitespace")
    if not colon:
        raise InvalidArgumentError(f"address={address!r} is not {usage}: no :PORT")
    if not host.strip("[]"):
        raise InvalidArgumentError(f"address={address!r} is not {usage}: no host name")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(
            f"address={address!r} is not {usage}: the port must be a number in [1, 65535]"
        )
    return address


def port_in_bind(bind: str) -> str | None:
    """The ``:PORT`` (or URL path) part of a ``bind`` value that should hold only a host.

    ``"localhost:8000"`` and ``"[::1]:8000"`` give ``"8000"``; a bare host or ``ipc://``
    path gives None.
    """
    if bind.startswith("ipc://"):
        return None
    if bind.startswith("tcp://"):
        bind = bind[len("tcp://") :]
    if "/" in bind:
        return bind[bind.index("/") :]
    if bind.startswith("["):
        rest = bind.partition("]")[2]
        return (rest.lstrip(":") or None) if rest else None
    if bind.count(":") == 1:  # an IPv6 address without brackets has two or more
        return bind.partition(":")[2]
    return None


def endpoint(bind: str, port: int | None) -> str:
    """The ZeroMQ endpoint to bind (``port`` 0/None: any free port, resolved at bind).

    Raises:
        InvalidArgumentError: if ``bind`` holds a port (give it as ``port``) or ``port``
            is not an int in [0, 65535].
    """
    if not isinstance(bind, str) or not bind:
        raise InvalidArgumentError(f"bind={describe(bind)} must be a host or ipc:// path")
    if bind.startswith("ipc://"):
        return bind
    extra = port_in_bind(bind)
    if extra is not None:
        raise InvalidArgumentError(
            f"bind={bind!r} must be a host (or ipc:///path), without a port or path: give "
            "the host as bind= and the port as port= (None: a free one)"
        )
    if bind.startswith("tcp://"):
        bind = bind[len("tcp://") :]
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536
    ):
        raise InvalidArgumentError(f"port={describe(port)} must be an int in [0, 65535]")
    host = f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind
    return f"tcp://{host}:{port or 0}"


def is_loopback(address: str) -> bool:
    """Whether ``address`` is reachable only from this host (loopback or ``ipc://``)."""
    if address.startswith("ipc://"):
        return True
    host = address[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_ipv6(address: str) -> bool:
    """Whether a ``tcp://`` address names an IPv6 host (``tcp://[::1]:5000``)."""
    return address.startswith("tcp://[")


def bind(sock: zmq.Socket, address: str) -> str:
    """Bind ``sock`` and return the address clients connect to (the real port).

    Raises:
        AddressInUseError: if another socket holds the address (host and port).
        InvalidArgumentError: if the address cannot be bound otherwise.
    """
    wanted = address
    if address.startswith("tcp://") and address.endswith(":0"):
        address = address[:-2] + ":*"
    if is_ipv6(address):
        sock.setsockopt(zmq.IPV6, 1)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUseError(
                f"cannot serve on {wanted}: the address is already in use (another server?); "
                "choose another port, or leave the port out (None) to pick a free one",
                wanted,
            ) from None
        raise InvalidArgumentError(
            f"cannot serve on {wanted}: {zmq.strerror(exc.errno)}; the host must be a name or "
            "address "
            "of this machine (or ipc:///path in a folder that exists)"
        ) from None
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def load_keys(path: str | os.PathLike) -> tuple[bytes, bytes | None]:
    """``(public, secret)`` from a key file written by ``rlreplay keygen`` (secret may be None).

    Raises:
        InvalidArgumentError: if the file is missing or not a key file.
    """
    import zmq.auth

    name = os.fspath(path)
    if not os.path.exists(name):
        raise InvalidArgumentError(
            f"the key file {name!r} does not exist; give the path of a key file written by "
            "`rlreplay keygen DIR` (NAME.key is public, NAME.key_secret secret)"
        )
    if os.path.isdir(name):
        raise InvalidArgumentError(
            f"{name!r} is a folder, not a key file; give a NAME.key or NAME.key_secret file "
            "written by `rlreplay keygen DIR`"
        )
    try:
        public, secret = zmq.auth.load_certificate(name)
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{os.fspath(path)!r} is not a readable key file ({exc}); create keys with "
            "`rlreplay keygen DIR`"
        ) from None
    return public, secret


def start_curve(ctx: zmq.Context, sock: zmq.Socket, secret_file: str, authorized: str | None):
    """Make ``sock`` a CURVE server and start a ZAP authenticator; returns it."""
    from zmq.auth.thread import ThreadAuthenticator

    public, secret = load_keys(secret_file)
    if secret is None:
        raise InvalidArgumentError(
            f"{secret_file!r} holds no secret key; give the server's .key_secret file"
        )
    authenticator = ThreadAuthenticator(ctx)
    authenticator.start()
    if authorized is not None:
        if not Path(authorized).is_dir():
            authenticator.stop()
            raise InvalidArgumentError(
                f"authorized_keys={authorized!r} is not a folder of client public .key files"
            )
        authenticator.configure_curve(domain="*", location=os.fspath(authorized))
    else:
        authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return authenticator


def keygen(folder: str | os.PathLike, name: str = "server") -> tuple[str, str]:
    """Write a CURVE key pair ``NAME.key`` (public) and ``NAME.key_secret``; returns paths.

    The folder is created if missing; an existing key pair is never overwritten.

    Raises:
        InvalidArgumentError: if ``name`` is not a plain file name, either file exists, or
            the folder cannot be created or written.
    """
    import zmq.auth

    if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
        raise InvalidArgumentError(f"name={describe(name)} must be a plain file name stem")
    existing = [p for p in (f"{name}.key", f"{name}.key_secret") if (Path(folder) / p).exists()]
    if existing:
        raise InvalidArgumentError(
            f"{os.fspath(folder)!r} already holds {existing}: keys are never overwritten; "
            "choose another name or folder (or delete the old pair on purpose)"
        )
    old_umask = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        public, secret = zmq.auth.create_certificates(os.fspath(folder), name)
        os.chmod(public, 0o644)
    except OSError as exc:
        raise InvalidArgumentError(
            f"cannot write keys to the folder {os.fspath(folder)!r}: {exc}"
        ) from None
    finally:
        os.umask(old_umask)
    return public, secret


def public_key(value: str | bytes | None) -> bytes | None:
    """A server public key given as a ``.key`` file path or z85 bytes (None: no CURVE)."""
    if value is None:
        return None
    if isinstance(value, bytes) and len(value) == 40:
        return value
    public, secret = load_keys(value)
    if secret is not None:
        logging.getLogger("rlreplay").warning(
            "the server key %r is a secret key file: a client needs only the server's "
            "public NAME.key, and the secret should stay on the server's machine",
            os.fspath(value),
        )
    return public


def client_keys(value: str | bytes | tuple[bytes, bytes] | None) -> tuple[bytes, bytes]:
    """A client's key pair: from a ``.key_secret`` file, given as a pair, or ephemeral.

    Raises:
        InvalidArgumentError: if the file holds no secret key.
    """
    if value is None:
        return zmq.curve_keypair()
    if isinstance(value, tuple) and len(value) == 2:
        return value
    public, secret = load_keys(value)
    if secret is None:
        raise InvalidArgumentError(
            f"client_secret_key={value!r} holds no secret key; give the .key_secret file"
        )
    return public, secret


HANDSHAKE_VERDICTS = (
    "ok",  # the connection and its security handshake succeed
    "needs_curve",  # the server uses CURVE and no server public key was given
    "not_curve",  # a server public key was given but the server does not use CURVE
    "wrong_server_key",  # the server refused the handshake: not its public key
    "client_not_authorized",  # the server's authenticator refused this client's key
    "refused",  # nothing accepts connections at the address
    "unresolved",  # the host name does not resolve to an address
    "silent",  # no answer at all within the timeout
)


# Why a connection failed, per verdict; the caller fills in the argument names.
UNREACHABLE_REASONS = {
    "needs_curve": "the server uses CURVE and no credentials were given: give "
    "{server_key_example} (its public key from `rlreplay keygen`), and {client_key_example} "
    "if it accepts only authorized clients",
    "not_curve": "the server does not use CURVE: leave out {server_key} and {client_key}",
    "wrong_server_key": "the server refused the CURVE handshake: {server_key} is not this "
    "server's public key",
    "client_not_authorized": "the server does not accept this client's key: give {client_key} "
    "with a .key_secret whose public .key is in the server's {authorized_keys} folder",
    "refused": "nothing accepts connections there: is the server running, and are the host "
    "name and the port right?",
    "unresolved": "its host name does not resolve to an address: check the name (a typo?), "
    "or give the server's IP address",
    "ok": "the server accepts connections but did not answer: it may be stalled or overloaded",
}
PYTHON_NAMES = {
    "server_key": "server_public_key",
    "server_key_example": 'server_public_key="SERVER.key"',
    "client_key": "client_secret_key",
    "client_key_example": 'client_secret_key="CLIENT.key_secret"',
    "authorized_keys": "authorized_keys",
}


def unreachable_reason(verdict: str | None, names: dict[str, str] = PYTHON_NAMES) -> str | None:
    """Why a connection failed, in words, for a :func:`diagnose_connection` verdict (None
    for ``"silent"``).

    Args:
        names: how to name the credentials: Python keywords (default) or a command's flags.
    """
    template = UNREACHABLE_REASONS.get(verdict) if verdict is not None else None
    return None if template is None else template.format(**names)


def resolves(address: str, timeout: float) -> bool | None:
    """Whether the host of ``address`` resolves; None if the resolver failed."""
    if address.startswith("ipc://"):
        return True
    host, _, port = address[len("tcp://") :].rpartition(":")
    answer: list[bool | None] = []
    unknown_name = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}

    def lookup() -> None:
        try:
            socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
            answer.append(True)
        except socket.gaierror as error:
            answer.append(False if error.errno in unknown_name else None)
        except (OSError, UnicodeError):
            answer.append(None)

    # the system resolver has no timeout: a slow lookup's thread is left behind
    thread = threading.Thread(target=lookup, name="rlreplay-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else None


def diagnose_connection(
    address: str,
    server_public_key: str | bytes | None = None,
    client_secret_key: str | bytes | tuple[bytes, bytes] | None = None,
    timeout: float = 1.0,
) -> str:
    """Why a connection to ``address`` fails, told by a monitored socket's handshake events.

    Args:
        address, server_public_key, client_secret_key: as for :class:`~rlreplay.Client`.
        timeout: seconds to watch the handshake.

    Returns:
        One of :data:`HANDSHAKE_VERDICTS`.

    Raises:
        InvalidArgumentError: for a malformed address or unreadable key files.
    """
    from zmq.utils.monitor import recv_monitor_message

    address = normalize_address(address)
    server_key = public_key(server_public_key)
    deadline = time.monotonic() + timeout  # the name's lookup and the handshake share it
    if resolves(address, timeout) is False:
        return "unresolved"
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # a later attempt tells more than the first: retry every 10 ms, not 100
    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    if server_key is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = client_keys(client_secret_key)
    if is_ipv6(address):
        sock.setsockopt(zmq.IPV6, 1)
    monitor = sock.get_monitor_socket()
    verdict, connected = "silent", False
    try:
        sock.connect(address)
        while (left := deadline - time.monotonic()) > 0 and monitor.poll(int(left * 1000) + 1):
            event = recv_monitor_message(monitor)
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_CONNECTED:
                connected = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "ok"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return "client_not_authorized"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    return "needs_curve" if server_key is None else "not_curve"
                if server_key is not None:
                    return "wrong_server_key"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and server_key is not None:
                # wrong server key, or a non-CURVE server closed first; a retry tells
                verdict = "wrong_server_key"
            elif kind == zmq.EVENT_CONNECT_RETRIED and not connected:
                return "refused"
        return verdict
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
