"""The transport's bound for one awaited call: echo round trips through pyzmq and through a
Unix seqpacket socket, against one server loop that polls both with ``zmq.Poller``.

Run from the repository root (about 10 s)::

    python benchmarks/anchors/echo_bound.py [--duration 1.0] [--rounds 3]

The server process answers a 60 B reply to each 4.2 KB request (the size of an
``update_priorities`` of 256 keys) from one loop polling its ZeroMQ ROUTER socket, a
listening ``AF_UNIX`` ``SOCK_SEQPACKET`` socket and the accepted links, as the replay
server's dispatcher does. Each client process makes awaited round trips for ``duration``
seconds: a pyzmq DEALER over TCP loopback, a seqpacket client that receives at once, and
one that polls before it receives (as the library's client does). Prints round trips/s
and the client's CPU per round trip, alternating the three in each round.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import select
import socket
import sys
import time
from pathlib import Path

# Run as a script: the repository root, for benchmarks.children.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import zmq

from benchmarks.children import reply_from

REQUEST = b"x" * 4200
REPLY = b"y" * 60
STOP = b"stop"


def serve(out, name: str) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.listen(16)
    listener.setblocking(False)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(listener.fileno(), zmq.POLLIN)
    links: dict[int, socket.socket] = {}
    out.put(port)
    events_opt, pollin = int(zmq.EVENTS), int(zmq.POLLIN)
    deadline = time.monotonic() + 600.0
    while time.monotonic() < deadline:
        events = dict(poller.poll(1000))
        if router in events:
            while router.getsockopt(events_opt) & pollin:
                identity = router.recv(0, copy=False)
                body = router.recv(0, copy=False)
                if body.bytes == STOP:
                    return
                router.send(identity, zmq.SNDMORE | zmq.NOBLOCK, copy=False)
                router.send(REPLY, zmq.NOBLOCK)
        if listener.fileno() in events:
            link, _ = listener.accept()
            link.setblocking(False)
            links[link.fileno()] = link
            poller.register(link.fileno(), zmq.POLLIN)
        for fd, link in list(links.items()):
            if fd in events:
                try:
                    data = link.recv(1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    poller.unregister(fd)
                    link.close()
                    del links[fd]
                    continue
                link.send(REPLY)


def zmq_client(port: int, duration: float, out) -> None:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)
    dealer.send(REQUEST)
    dealer.recv()
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    end = start + duration
    while time.perf_counter() < end:
        dealer.send(REQUEST, zmq.NOBLOCK)
        if not poller.poll(10_000):
            raise RuntimeError("no reply within 10 s")
        dealer.recv(0, copy=False)
        n += 1
    out.put(("pyzmq DEALER/ROUTER (tcp)", n / (time.perf_counter() - start),
             (time.process_time() - cpu) / n * 1e6))  # fmt: skip
    dealer.close(0)
    ctx.term()


def unix_client(name: str, duration: float, poll_first: bool, out) -> None:
    link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link.settimeout(10.0)
    link.connect("\0" + name)
    poller = select.poll()
    poller.register(link.fileno(), select.POLLIN)
    link.send(REQUEST)
    link.recv(1 << 16)
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    end = start + duration
    while time.perf_counter() < end:
        link.send(REQUEST)
        if poll_first and not poller.poll(10_000):
            raise RuntimeError("no reply within 10 s")
        link.recv(1 << 16)
        n += 1
    label = "AF_UNIX seqpacket" + (", poll then recv" if poll_first else ", recv")
    out.put((label, n / (time.perf_counter() - start), (time.process_time() - cpu) / n * 1e6))
    link.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    name = "rlreplay-echo-" + secrets.token_hex(8)
    server = ctx.Process(target=serve, args=(out, name), daemon=True)
    server.start()
    port = reply_from(server, out, 60)
    try:
        for _ in range(args.rounds):
            for call in (
                (zmq_client, (port, args.duration, out)),
                (unix_client, (name, args.duration, False, out)),
                (unix_client, (name, args.duration, True, out)),
            ):
                proc = ctx.Process(target=call[0], args=call[1])
                proc.start()
                label, rate, cpu = out.get(timeout=args.duration + 60)
                proc.join(30)
                print(f"{label:40s} {rate:10,.0f} round trips/s  client CPU {cpu:5.1f} us  "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    finally:
        ctl = zmq.Context()
        stopper = ctl.socket(zmq.DEALER)
        stopper.connect(f"tcp://127.0.0.1:{port}")
        stopper.send(STOP)
        server.join(5)
        if server.is_alive():
            server.kill()
        stopper.close(0)
        ctl.term()


if __name__ == "__main__":
    main()
