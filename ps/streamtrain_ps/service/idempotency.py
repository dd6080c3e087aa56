"""Server-side memory of recently applied pushes, so a retried push is applied once.

A push whose response is lost (the connection drops after the server applied it) surfaces
at the client as ``UNAVAILABLE`` and is retried. Without help the server cannot tell the
retry from a new push and applies the gradient, shows and clicks twice. Clients therefore
tag each push with ``(client_id, seq)`` (``ps.proto`` ``RequestId``); this module remembers
the ids it applied and answers a repeat with the first answer, without applying it again.

Bounded memory, by three means:

- the client sends ``acked_below`` (every seq below it was answered, so it will never be
  retried): entries below it are dropped — normally only the client's in-flight pushes are
  remembered;
- at most ``per_client`` entries per client (the oldest go first) for clients that never
  advance ``acked_below``;
- at most ``clients`` clients and ``total`` entries over all clients, least recently seen
  clients evicted first (workers come and go; a hostile caller inventing ids cannot grow
  the server beyond ~``total`` × 200 B). An evicted client's retries would be applied
  again — only possible past these limits.

A retry that arrives while the first copy is still being applied waits for it and returns
its answer; if the first copy failed (nothing applied), the retry applies normally.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from streamtrain_ps.errors import InvalidRequestError

R = TypeVar("R")

#: Longest client id accepted (clients send 16 random bytes).
MAX_CLIENT_ID_BYTES = 64


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    ok: bool = False


@dataclass
class _Client:
    entries: OrderedDict[int, _Entry] = field(default_factory=OrderedDict)
    floor: int = 0


class RecentRequests:
    """Applied request ids per client (see the module docstring). Thread-safe."""

    def __init__(self, per_client: int = 8192, clients: int = 1024, total: int = 131_072) -> None:
        if per_client < 1 or clients < 1 or total < per_client:
            raise ValueError("need per_client, clients >= 1 and total >= per_client")
        self._per_client = per_client
        self._max_clients = clients
        self._max_total = total
        self._total = 0
        self._lock = threading.Lock()
        self._clients: OrderedDict[bytes, _Client] = OrderedDict()

    def __len__(self) -> int:
        """Entries remembered over all clients (tests check the bound)."""
        with self._lock:
            return sum(len(c.entries) for c in self._clients.values())

    def run(
        self, client_id: bytes, seq: int, acked_below: int, apply: Callable[[], R]
    ) -> tuple[R, bool]:
        """``(apply(), False)`` the first time ``(client_id, seq)`` is seen, ``(first
        answer, True)`` for a repeat. Exceptions of ``apply`` propagate and forget the id."""
        if not client_id or len(client_id) > MAX_CLIENT_ID_BYTES:
            raise InvalidRequestError(
                "id", f"client_id must be 1..{MAX_CLIENT_ID_BYTES} bytes, got {len(client_id)}"
            )
        if seq < 1:
            raise InvalidRequestError("id", f"seq must be >= 1, got {seq}")
        while True:
            with self._lock:
                client = self._client(client_id)
                if acked_below > client.floor:
                    client.floor = acked_below
                    for old in [s for s in client.entries if s < acked_below]:
                        del client.entries[old]
                        self._total -= 1
                entry = client.entries.get(seq)
                if entry is None:
                    if seq < client.floor:
                        raise InvalidRequestError(
                            "id", f"seq {seq} is below acked_below {client.floor}: answered"
                        )
                    entry = _Entry()
                    client.entries[seq] = entry
                    self._total += 1
                    while len(client.entries) > self._per_client:
                        client.entries.popitem(last=False)
                        self._total -= 1
                    while self._total > self._max_total and len(self._clients) > 1:
                        self._evict_oldest_client()
                    break
            entry.done.wait()
            if entry.ok:
                return entry.result, True
            # the first copy failed and was forgotten: apply this one
        try:
            entry.result = apply()
            entry.ok = True
        except BaseException:
            with self._lock:
                c = self._clients.get(client_id)
                if c is not None and c.entries.get(seq) is entry:
                    del c.entries[seq]
                    self._total -= 1
            raise
        finally:
            entry.done.set()
        return entry.result, False

    def _client(self, client_id: bytes) -> _Client:
        client = self._clients.get(client_id)
        if client is None:
            client = _Client()
            self._clients[client_id] = client
            while len(self._clients) > self._max_clients:
                self._evict_oldest_client()
        else:
            self._clients.move_to_end(client_id)
        return client

    def _evict_oldest_client(self) -> None:
        _, old = self._clients.popitem(last=False)
        self._total -= len(old.entries)
