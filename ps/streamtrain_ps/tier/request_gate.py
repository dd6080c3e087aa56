"""How many sparse requests a capped shard serves at once: as many as its scratch reserve
holds, counted in bytes.

A capped shard's scratch reserve (``memory_limit.MemoryBudget.scratch``) is sized for
``requests_in_flight`` requests of the largest size the shard admits. Counting requests
would let two clients' 34k-key pulls wait for each other under a reserve sized for one
65,536-key request, although both fit in it; counting their bytes (keys times the measured
cost per key) admits both and still never more than the reserve. A request waits at the
gate until its bytes fit beside those already admitted; no request is ever larger than the
whole capacity (the reserve holds the largest admitted request), so each eventually runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RequestGate:
    """A byte budget shared by the requests in flight; ``capacity`` 0: no bound."""

    def __init__(self, capacity: int, bytes_per_key: int) -> None:
        self.capacity = capacity
        self.bytes_per_key = bytes_per_key
        self._used = 0
        self._cond = threading.Condition()

    @property
    def used(self) -> int:
        """Bytes of the requests admitted now."""
        return self._used

    @contextmanager
    def admit(self, keys: int) -> Iterator[None]:
        """Held while a request of ``keys`` keys is served: waits until its bytes fit."""
        if not self.capacity:
            yield
            return
        need = min(self.capacity, max(1, keys) * self.bytes_per_key)
        with self._cond:
            self._cond.wait_for(lambda: self._used + need <= self.capacity)
            self._used += need
        try:
            yield
        finally:
            with self._cond:
                self._used -= need
                self._cond.notify_all()
