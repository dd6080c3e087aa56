"""Client-side gRPC plumbing of ``RemotePS``: channels to N PS servers, the parallel
fan-out, the retry policy, and status codes mapped back to ``streamtrain_ps.errors``.

Retries, in two layers:

- a gRPC service-config ``retryPolicy`` (``UNAVAILABLE``, 3 attempts, 20–200 ms) hides
  blips such as a reconnect, transparently inside the channel;
- ``FanOut.call_all`` retries ``UNAVAILABLE`` and an overloaded server's
  ``RESOURCE_EXHAUSTED`` (``request_budget.is_overloaded``: nothing was applied) — and
  ``DEADLINE_EXCEEDED`` for idempotent
  methods only — with exponential backoff, bounded by attempts and total time
  (``RetryPolicy``), then raises ``PSUnavailableError``. A shrink that timed out may have
  been applied, so it is never retried on ``DEADLINE_EXCEEDED``; pushes are, because each
  carries a request id the server deduplicates (a repeat is acknowledged, not re-applied).

``error_from_rpc`` is the inverse of ``servicer.status_of``: the servicer sends the field and
table names as trailing metadata, so local and remote PS raise the same classes.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import grpc

from streamtrain_ps.client.dense_push import DensePush
from streamtrain_ps.config import PSConfig
from streamtrain_ps.errors import (
    CheckpointError,
    InvalidRequestError,
    MemoryLimitError,
    PSError,
    PSUnavailableError,
    RequestTooLargeError,
    UnknownTableError,
    WorkingSet,
)
from streamtrain_ps.plumbing.grpc_serving import RECONNECT_OPTIONS
from streamtrain_ps.plumbing.request_budget import is_overloaded
from streamtrain_ps.plumbing.retry import RetryPolicy
from streamtrain_ps.plumbing.tls import TLSFiles
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service.server import SERVICE_NAME, channel_options
from streamtrain_ps.service.servicer import FIELD_KEY, KIND_KEY, NAME_KEY

log = logging.getLogger(__name__)

#: Called before each explicit retry: (method, endpoint, attempt, code).
RetryHook = Callable[[str, str, int, grpc.StatusCode], None]

#: Safe to resend after DEADLINE_EXCEEDED. Pushes are, because ``RemotePS`` tags each with a
#: request id the server deduplicates (``streamtrain_ps.service.idempotency``); Shrink is not.
_IDEMPOTENT = frozenset(
    {
        "PullSparse",
        "PullDense",
        "InitDense",
        "Stats",
        "Save",
        "FinishSave",
        "Load",
        "PushSparse",
        "PushDense",
    }
)


def service_config() -> str:
    """The gRPC service config declaring transparent UNAVAILABLE retries for every method."""
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{"service": SERVICE_NAME}],
                    "retryPolicy": {
                        "maxAttempts": 3,
                        "initialBackoff": "0.02s",
                        "maxBackoff": "0.2s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


def error_from_rpc(err: grpc.RpcError, method: str, endpoint: str) -> PSError:
    """The ``streamtrain_ps.errors`` exception a local shard would have raised."""
    call = cast(grpc.Call, err)
    code = call.code()
    details = call.details() or ""
    meta = {m.key: _text(m.value) for m in (call.trailing_metadata() or ())}
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        field = meta.get(FIELD_KEY, "request")
        return InvalidRequestError(field, details.removeprefix(f"{field}: "))
    if code is grpc.StatusCode.NOT_FOUND and KIND_KEY in meta:
        return UnknownTableError(meta[KIND_KEY], meta.get(NAME_KEY, ""))
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        working_set = WorkingSet.from_metadata(meta.items())
        if working_set is not None:
            return MemoryLimitError(f"{method} on {endpoint}: {details}", working_set)
        return RequestTooLargeError(f"{method} on {endpoint}: {details}")
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return CheckpointError(details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return PSUnavailableError(f"{method} on {endpoint}: {code.name}: {details}")
    return PSError(f"{method} on {endpoint}: {code.name}: {details}")


class FanOut:
    """Channels to every server (``channels_per_server`` TCP connections each, used round
    robin) and ``call_all``: many (server, request) pairs in flight at once. Thread-safe."""

    def __init__(
        self,
        endpoints: Sequence[str],
        config: PSConfig,
        *,
        retry: RetryPolicy | None = None,
        channels_per_server: int = 2,
        on_retry: RetryHook | None = None,
        tls: TLSFiles | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("RemotePS needs at least one endpoint")
        if channels_per_server < 1:
            raise ValueError(f"channels_per_server must be >= 1, got {channels_per_server}")
        self.endpoints = tuple(endpoints)
        self._retry = retry or RetryPolicy()
        self._on_retry = on_retry
        self._closed = threading.Event()
        options: list[tuple[str, Any]] = [
            *channel_options(config),
            ("grpc.service_config", service_config()),
            ("grpc.enable_retries", 1),
            *RECONNECT_OPTIONS,
            # Separate TCP connections per channel, so big messages do not queue on one.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        credentials = None
        if (
            tls is not None
        ):  # streamtrain_ps.plumbing.tls: server verification, optional client cert
            credentials = tls.channel_credentials()
            options += tls.channel_options()
        self._channels = [
            [_channel(ep, options, credentials) for _ in range(channels_per_server)]
            for ep in self.endpoints
        ]
        self._stubs = [
            [ps_pb2_grpc.ParameterServerStub(c) for c in chans] for chans in self._channels
        ]
        # PushSparse with its dense gradients appended from their arrays (``DensePush``).
        self._dense_pushes = [
            [
                c.unary_unary(
                    f"/{SERVICE_NAME}/PushSparse",
                    request_serializer=DensePush.serialize,
                    response_deserializer=ps_pb2.PushSparseResponse.FromString,
                )
                for c in chans
            ]
            for chans in self._channels
        ]
        self._next = itertools.count()

    def wait_connected(self, timeout: float) -> None:
        """Block until every channel is connected, or raise ``PSUnavailableError``."""
        deadline = time.monotonic() + timeout
        for ep, chans in zip(self.endpoints, self._channels, strict=True):
            for ch in chans:
                try:
                    grpc.channel_ready_future(ch).result(
                        timeout=max(0.0, deadline - time.monotonic())
                    )
                except grpc.FutureTimeoutError:
                    raise PSUnavailableError(f"{ep}: not ready after {timeout}s") from None

    def close(self) -> None:
        """Stop retrying and close every channel."""
        self._closed.set()
        for chans in self._channels:
            for ch in chans:
                ch.close()

    def _method(self, method: str, server: int, request: Any) -> grpc.UnaryUnaryMultiCallable:
        """``method`` of one of ``server``'s channels, round robin."""
        i = next(self._next) % len(self._stubs[server])
        if method == "PushSparse" and isinstance(request, DensePush):
            return self._dense_pushes[server][i]
        fn: grpc.UnaryUnaryMultiCallable = getattr(self._stubs[server][i], method)
        return fn

    def _start(
        self, method: str, call: tuple[int, Any], timeout: float, fanout: int
    ) -> grpc.Future | _Done:
        """Send one call: a future when several are in flight, else a blocking call.

        A lone call (one server, one chunk: every call of a one-shard job) is made blocking
        in the caller's thread. ``.future()`` would hand it to grpc's channel spin thread,
        which grpc starts afresh whenever a channel has no call in flight — a thread start
        plus two thread hand-offs per RPC, the largest client cost of a worker's step.
        """
        fn = self._method(method, call[0], call[1])
        if fanout == 1:
            return _Done(fn, call[1], timeout)
        return fn.future(call[1], timeout=timeout)

    def call_all(
        self,
        method: str,
        calls: Sequence[tuple[int, Any]],
        *,
        control: bool = False,
        settle: bool = False,
    ) -> list[Any]:
        """Send every (server, request) at once; retry the failed ones; answers in order.

        On a non-retryable error the other calls are cancelled, or with ``settle`` awaited
        first — a two-phase caller's abort must reach servers *after* their first phase."""
        if self._closed.is_set():
            raise PSError("RemotePS is closed")
        policy = self._retry
        timeout = policy.control_timeout if control else policy.rpc_timeout
        retryable = {grpc.StatusCode.UNAVAILABLE}
        if method in _IDEMPOTENT:
            retryable.add(grpc.StatusCode.DEADLINE_EXCEEDED)
        deadline = time.monotonic() + policy.total_seconds
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in itertools.count(1):
            futures = [(i, self._start(method, calls[i], timeout, len(pending))) for i in pending]
            failed: list[int] = []
            last: tuple[grpc.RpcError, int] | None = None
            fatal: PSError | None = None
            for n, (i, fut) in enumerate(futures):
                try:
                    results[i] = fut.result()
                except grpc.RpcError as err:
                    code = cast(grpc.Call, err).code()
                    # A server over its request-bytes or RPC cap applied nothing: retry.
                    if code not in retryable and not is_overloaded(err):
                        fatal = fatal or error_from_rpc(err, method, self.endpoints[calls[i][0]])
                        if settle:
                            continue
                        for _, other in futures[n + 1 :]:
                            other.cancel()
                        raise fatal from None
                    failed.append(i)
                    last = (err, calls[i][0])
            if fatal is not None:
                raise fatal from None
            if not failed:
                return results
            assert last is not None
            last_err, server = last
            call = cast(grpc.Call, last_err)
            code = call.code()
            endpoint = self.endpoints[server]
            backoff = policy.delay(attempt - 1)
            if (
                attempt >= policy.max_attempts
                or time.monotonic() + backoff > deadline
                or self._closed.is_set()
            ):
                raise PSUnavailableError(
                    f"{method} on {endpoint}: {code.name} after {attempt} attempts: "
                    f"{call.details()}"
                ) from None
            log.warning(
                "%s on %s: %s, retry %d in %.2fs", method, endpoint, code.name, attempt, backoff
            )
            if self._on_retry is not None:
                self._on_retry(method, endpoint, attempt, code)
            self._closed.wait(backoff)
            pending = failed
        raise AssertionError("unreachable")  # pragma: no cover


class _Done:
    """A blocking call's outcome behind the two methods ``call_all`` uses of a future."""

    def __init__(self, fn: Callable[..., Any], request: Any, timeout: float) -> None:
        self._error: grpc.RpcError | None = None
        try:
            self._value = fn(request, timeout=timeout)
        except grpc.RpcError as err:
            self._value, self._error = None, err

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> bool:
        return False


def _channel(
    endpoint: str, options: list[tuple[str, Any]], credentials: grpc.ChannelCredentials | None
) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(endpoint, options=options)
    return grpc.secure_channel(endpoint, credentials, options=options)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value
