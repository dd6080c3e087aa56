"""A server's cap on the request bytes it holds at once, and one quiet line per bad peer.

grpc bounds each message (``max_receive_message_length``) but not how many it parses and
serves at once: six concurrent 250 MiB pushes took a shard to 1.78 GiB. ``RequestBudget``
is a server interceptor that counts each request's wire bytes from the moment it is parsed
until its answer is built; a request that does not fit beside those admitted is answered
``RESOURCE_EXHAUSTED`` at once, with trailing metadata ``streamtrain-reason: overloaded``
(nothing was applied, so every client retries it with backoff: ``streamtrain_ps.client.rpc``). A
single request is always admitted when nothing else is in flight, so none starves.

The same wrapper parses the request itself, so bytes that are no message of the method
(random bytes on the wire) are ``INVALID_ARGUMENT`` and logged once per peer per
``LOG_INTERVAL`` with a count, not a traceback per request (grpc's own handling logs an
ERROR with a traceback each time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger(__name__)

REASON_KEY = "streamtrain-reason"
OVERLOADED = "overloaded"
#: grpc's own answer once ``maximum_concurrent_rpcs`` are queued or running.
CONCURRENCY_LIMIT_DETAILS = "Concurrent RPC limit exceeded!"
LOG_INTERVAL = 60.0


def is_overloaded(err: grpc.RpcError) -> bool:
    """A refusal for load (nothing applied, retry later), not for the request's size."""
    call: Any = err
    if call.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    if call.details() == CONCURRENCY_LIMIT_DETAILS:
        return True
    return any(
        m.key == REASON_KEY and m.value == OVERLOADED for m in (call.trailing_metadata() or ())
    )


class ThrottledLog:
    """At most one warning per key (a peer) per ``interval``, with what was held back."""

    def __init__(self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self._interval = interval
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str) -> bool:
        """Log ``message`` for ``key`` unless it was logged within the interval; True if
        logged."""
        now = self._clock()
        with self._lock:
            last, held = self._last.get(key, (-self._interval, 0))
            if now - last < self._interval:
                self._last[key] = (last, held + 1)
                return False
            self._last[key] = (now, 0)
            if len(self._last) > 10_000:  # peers come and go: forget the oldest
                self._last.pop(next(iter(self._last)))
        suffix = f" ({held} more since the last line)" if held else ""
        log.warning("%s: %s%s", key, message, suffix)
        return True


@dataclass
class _Parsed:
    message: Any
    size: int


@dataclass
class _Refused:
    size: int


@dataclass
class _Malformed:
    size: int
    error: str


_Request = _Parsed | _Refused | _Malformed


class RequestBudget(grpc.ServerInterceptor):
    """Caps the bytes of the requests a server holds (``capacity`` 0: no cap) and turns
    unparsable requests into ``INVALID_ARGUMENT`` with throttled logging."""

    def __init__(self, capacity: int, malformed: ThrottledLog | None = None) -> None:
        self.capacity = capacity
        self._used = 0
        self._count = 0
        self._lock = threading.Lock()
        self._malformed = malformed or ThrottledLog()

    @property
    def used(self) -> int:
        return self._used

    def _take(self, size: int) -> bool:
        with self._lock:
            if self.capacity and self._count and self._used + size > self.capacity:
                return False
            self._used += size
            self._count += 1
            return True

    def _give(self, size: int) -> None:
        with self._lock:
            self._used -= size
            self._count -= 1

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        parse, inner, method = handler.request_deserializer, handler.unary_unary, details.method

        def deserialize(raw: bytes) -> _Request:
            size = len(raw)
            if not self._take(size):
                return _Refused(size)
            try:
                return _Parsed(parse(raw), size)
            except Exception as exc:  # any parse failure: the peer sent no such message
                self._give(size)
                return _Malformed(size, f"{type(exc).__name__}: {exc}")

        def behavior(
            request: _Parsed | _Refused | _Malformed, context: grpc.ServicerContext
        ) -> Any:
            if isinstance(request, _Refused):
                context.set_trailing_metadata(((REASON_KEY, OVERLOADED),))
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{method}: {request.size} request bytes do not fit beside the "
                    f"{self._used} in flight (cap {self.capacity}); retry later",
                )
                raise AssertionError("abort returned")  # pragma: no cover - grpc raises
            if isinstance(request, _Malformed):
                self._malformed.warning(
                    context.peer(),
                    f"malformed {method} request of {request.size} bytes: {request.error}",
                )
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{method}: the request is not a valid message ({request.error})",
                )
                raise AssertionError("abort returned")  # pragma: no cover - grpc raises
            try:
                return inner(request.message, context)
            finally:
                self._give(request.size)

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=deserialize,
            response_serializer=handler.response_serializer,
        )
