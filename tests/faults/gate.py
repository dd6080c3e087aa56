"""A TCP forwarder on 127.0.0.1 that can hold the client -> server direction.

The operator-kill test needs the workers *inside* a pass when the operator dies, for as
long as the test wants: a pass of a few hundred rows takes milliseconds, an operator
restart seconds. The workers dial the PS through this gate (``Kubelet.routes``); while it
holds, their pulls and pushes wait in the gate, so each worker is busy in ``RunPass``
(its control server answers health, and ``Reset`` with "busy"); ``held`` gives the client
ports of the connections with a request waiting and ``owners`` the processes behind them —
proof that each worker's pass started. Releasing lets the held requests through in order;
nothing is dropped or duplicated.

Loopback only, port 0, every thread joined by ``close()``.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from pathlib import Path

#: How often blocked threads look at the stop flag.
_IO_TIMEOUT = 0.1


class Gate:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (``host:port``); ``hold``/``release``."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        if host != "127.0.0.1":
            raise ValueError(f"loopback targets only, got {target}")
        self._target = (host, int(port))
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        #: Connection number -> the client's port, for connections with bytes held.
        self._held: dict[int, int] = {}
        self._stop = threading.Event()
        #: What happened to connections, for failure messages.
        self.log: list[str] = []
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_IO_TIMEOUT)
        self._acceptor = threading.Thread(target=self._accept, name="gate-accept")
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def hold(self) -> None:
        """From now on, client bytes wait in the gate."""
        self._open.clear()

    def release(self) -> None:
        """Let everything held through, in order, and forward freely again."""
        with self._lock:
            self._held.clear()
        self._open.set()

    def held(self) -> set[int]:
        """The client ports of the connections that have bytes waiting in the gate (a
        client may hold several connections: ``owners`` tells whose they are)."""
        with self._lock:
            return set(self._held.values())

    def describe(self) -> str:
        """Held client ports, whether it still accepts, and its log (for failures)."""
        alive = self._acceptor.is_alive()
        return f"held {sorted(self.held())}, accepting {alive}, log {self.log}"

    def close(self) -> None:
        self._stop.set()
        self._open.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            _close(s)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------

    def _accept(self) -> None:
        number = 0
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                self.log.append(f"accept stopped: {exc!r}")
                return
            try:
                server = socket.create_connection(self._target, timeout=5)
                peer = int(client.getpeername()[1])
            except OSError as exc:
                self.log.append(f"{time.monotonic():.2f} not forwarded: {exc!r}")
                _close(client)
                continue
            number += 1
            for s in (client, server):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks += [client, server]
            self.log.append(f"{time.monotonic():.2f} connection {number} from port {peer}")
            for args in ((client, server, number, peer), (server, client, 0, 0)):
                t = threading.Thread(target=self._pump, args=args, name="gate-io")
                t.start()
                self._threads.append(t)

    def _pump(self, source: socket.socket, sink: socket.socket, number: int, peer: int) -> None:
        """``source`` -> ``sink``; a client side (``number`` > 0) waits while held."""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([source], [], [], _IO_TIMEOUT)
                if not ready:
                    continue
                data = source.recv(65536)
            except (OSError, ValueError) as exc:
                self.log.append(f"{time.monotonic():.2f} {number or 'server'} {peer}: {exc!r}")
                break
            if not data:
                self.log.append(f"{time.monotonic():.2f} EOF {number or 'server'} {peer}")
                break
            if number and not self._open.is_set():
                with self._lock:
                    self._held[number] = peer
                while not self._open.wait(_IO_TIMEOUT) and not self._stop.is_set():
                    pass
            try:
                sink.sendall(data)
            except OSError as exc:
                self.log.append(f"{time.monotonic():.2f} {number or 'server'} {peer}: {exc!r}")
                break
        _close(source)
        _close(sink)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


def owners(ports: set[int], pids: dict[str, int]) -> set[str]:
    """Which of ``pids`` (name -> pid) own a local TCP socket on 127.0.0.1 with one of
    ``ports`` (from ``/proc``: the socket's inode, then the processes' descriptors)."""
    inodes: set[str] = set()
    # gRPC dials 127.0.0.1 from an IPv6 socket (v4-mapped ::ffff:127.0.0.1): look in both.
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if address.endswith("0100007F") and int(port, 16) in ports:
                inodes.add(fields[9])
    found: set[str] = set()
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        found.add(name)
    return found
