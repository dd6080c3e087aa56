"""A TCP proxy on 127.0.0.1 that breaks the network between a PS client and a server.

Fault case 7 (network trouble between worker and PS) needs failures a real network has and
``grpc`` cannot fake from inside one process:

- **drop after apply** (``drop_responses(n)``): the request is forwarded, the server applies
  it, and the connection is cut when the server's response starts — the client sees
  ``UNAVAILABLE`` for a request that *was* applied. The proxy reads the server's HTTP/2
  frames and cuts at the first ``HEADERS`` frame of a stream: a gRPC unary server sends its
  response headers only with the response, i.e. after the handler returned;
- **refuse** (``refuse(n)``): the next ``n`` connections are accepted and closed at once
  (the client's reconnects fail until the budget is used up — no timers involved);
- **delay** (``delay``): every client -> server chunk waits this long (bounded);
- **cut** (``cut()``): close every open connection now.

Loopback only, port 0, every thread joined by ``close()``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass

#: HTTP/2 frame header size and the HEADERS frame type (RFC 9113 §4.1, §6.2).
_FRAME_HEADER = 9
_HEADERS = 0x1
#: How often blocked I/O threads look at the stop flag (the server sends no connection
#: preface, so its byte stream is HTTP/2 frames from the first byte).
_IO_TIMEOUT = 0.1


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0
    dropped: int = 0


class NetProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (``host:port``) with injectable faults."""

    def __init__(self, target: str, *, delay: float = 0.0) -> None:
        host, port = target.rsplit(":", 1)
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"loopback targets only, got {target}")
        if not 0.0 <= delay <= 1.0:
            raise ValueError(f"delay must be in [0, 1] s, got {delay}")
        self._target = ("127.0.0.1", int(port))
        self.delay = delay
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._refuse = 0
        self._drop = 0
        self._stop = threading.Event()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_IO_TIMEOUT)
        self._acceptor = threading.Thread(target=self._accept, name="netproxy-accept")
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def refuse(self, n: int) -> None:
        """Close the next ``n`` connections right after accepting them."""
        with self._lock:
            self._refuse += n

    def drop_responses(self, n: int) -> None:
        """Cut the connection at each of the next ``n`` responses (after the server applied
        the request, before the client hears of it)."""
        with self._lock:
            self._drop += n

    def armed(self) -> int:
        """Responses still to be dropped plus connections still to be refused."""
        with self._lock:
            return self._drop + self._refuse

    def cut(self) -> None:
        """Close every open connection (the client must reconnect)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for pair in conns:
            _close(*pair)

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        self.cut()
        for t in self._threads:
            t.join(timeout=5)

    # -- plumbing -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refuse = self._refuse > 0
                if refuse:
                    self._refuse -= 1
                    self.stats.refused += 1
                else:
                    self.stats.connections += 1
            if refuse:
                _close(client)
                continue
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(client)
                continue
            for s in (client, server):
                s.settimeout(None)  # blocking sends; receives poll with select
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.append((client, server))
            for target in (self._upstream, self._downstream):
                t = threading.Thread(target=target, args=(client, server), name="netproxy-io")
                t.start()
                self._threads.append(t)

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        """Client -> server, optionally delayed."""
        while not self._stop.is_set():
            data = _recv(client)
            if data is None:
                continue
            if not data:
                break
            if self.delay and self._stop.wait(self.delay):
                break
            if not _send(server, data):
                break
        _close(client, server)

    def _downstream(self, client: socket.socket, server: socket.socket) -> None:
        """Server -> client, frame by frame, cutting at an armed response."""
        buf = b""
        while not self._stop.is_set():
            data = _recv(server)
            if data is None:
                continue
            if not data:
                break
            buf += data
            out = bytearray()
            while len(buf) >= _FRAME_HEADER:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < _FRAME_HEADER + length:
                    break
                ftype = buf[3]
                stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                if ftype == _HEADERS and stream and self._take_drop():
                    _send(client, bytes(out))
                    _close(client, server)
                    return
                out += buf[: _FRAME_HEADER + length]
                buf = buf[_FRAME_HEADER + length :]
            if out and not _send(client, bytes(out)):
                break
        _close(client, server)

    def _take_drop(self) -> bool:
        with self._lock:
            if self._drop <= 0:
                return False
            self._drop -= 1
            self.stats.dropped += 1
            return True


def _recv(s: socket.socket) -> bytes | None:
    """Bytes, b"" at EOF or error, None on timeout (the caller checks for stop)."""
    try:
        ready, _, _ = select.select([s], [], [], _IO_TIMEOUT)
        if not ready:
            return None
        return s.recv(65536)
    except (OSError, ValueError):  # closed by cut() meanwhile
        return b""


def _send(s: socket.socket, data: bytes) -> bool:
    try:
        s.sendall(data)
        return True
    except OSError:
        return False


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()
