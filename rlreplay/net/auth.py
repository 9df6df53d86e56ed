"""Addresses, loopback checks and ZeroMQ CURVE authentication for server and client.

CURVE gives each side a key pair; the client must know the server's public key, and the
server's ZAP handler (:class:`zmq.auth.thread.ThreadAuthenticator`) accepts only the client
public keys found in an ``authorized_keys`` folder (or any client key when none is given,
which still requires the server's public key). Keys come from ``rlreplay keygen``.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import zmq

from rlreplay.errors import InvalidArgumentError, describe

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def normalize_address(address: str) -> str:
    """``host:port`` becomes ``tcp://host:port``; ``tcp://`` and ``ipc://`` pass through.

    Raises:
        InvalidArgumentError: for anything else.
    """
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError(f"address={describe(address)} must be a string")
    if address.startswith(("tcp://", "ipc://")):
        return address
    if ":" in address and "/" not in address:
        return "tcp://" + address
    raise InvalidArgumentError(
        f"address={address!r} is not tcp://HOST:PORT, HOST:PORT or ipc:///path"
    )


def endpoint(bind: str, port: int | None) -> str:
    """The ZeroMQ endpoint to bind (``port`` 0/None: any free port, resolved at bind)."""
    if not isinstance(bind, str) or not bind:
        raise InvalidArgumentError(f"bind={describe(bind)} must be a host or ipc:// path")
    if bind.startswith("ipc://"):
        return bind
    if bind.startswith("tcp://"):
        bind = bind[len("tcp://") :]
    if port is not None and (not isinstance(port, int) or not 0 <= port < 65536):
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
    """Bind ``sock`` and return the address clients connect to (the real port)."""
    if address.startswith("tcp://") and address.endswith(":0"):
        address = address[:-2] + ":*"
    if is_ipv6(address):
        sock.setsockopt(zmq.IPV6, 1)
    sock.bind(address)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def load_keys(path: str | os.PathLike) -> tuple[bytes, bytes | None]:
    """``(public, secret)`` from a key file written by ``rlreplay keygen`` (secret may be None).

    Raises:
        InvalidArgumentError: if the file is missing or not a key file.
    """
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(os.fspath(path))
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
    """Write a CURVE key pair ``NAME.key`` (public) and ``NAME.key_secret``; returns paths."""
    import zmq.auth

    Path(folder).mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(os.fspath(folder), name)
    os.chmod(secret, 0o600)
    return public, secret


def public_key(value: str | bytes | None) -> bytes | None:
    """A server public key given as a ``.key`` file path or z85 bytes (None: no CURVE)."""
    if value is None:
        return None
    if isinstance(value, bytes) and len(value) == 40:
        return value
    return load_keys(value)[0]


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
