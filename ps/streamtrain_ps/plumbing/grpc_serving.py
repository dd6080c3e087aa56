"""The gRPC serving skeleton shared by the PS shard server and the worker control server.

Both servers need the same things around their own servicer: a named thread pool, one
message limit for both directions, ``so_reuseport`` off (else two servers could silently
bind the same explicit port), the standard ``grpc.health.v1`` service reporting SERVING for
``""`` and the service's full name once bound, port 0 = a free port reported back by
``port``, and a graceful stop that flips health to NOT_SERVING *before* refusing new RPCs so
Kubernetes and clients stop sending first; a cap on the request bytes in flight and on
queued RPCs (``request_budget``), and optionally mutual TLS with a plaintext health port
(``tls``). ``GrpcServer`` is that skeleton; subclasses only
register their servicer on ``self._server``. Around it, what both ``process`` modules run:
``started`` (the start, a bind error reported), ``serve_metrics`` (the Prometheus endpoint
either may open beside its server), ``stop_on_signals`` (SIGTERM/SIGINT handling) and
``exit_now`` (the end once stopped).

It lives in ``streamtrain_ps`` because the PS is the bottom layer: the worker may import it,
the PS may not import the worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server

from streamtrain_ps.plumbing.request_budget import RequestBudget

log = logging.getLogger(__name__)


#: Client channel options: a restarted server (same address) is found within ~1 s, not
#: grpc's default 120 s reconnect cap (``RemotePS`` to PS shards, the driver to workers).
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """The one message limit, in both directions, as gRPC server/channel options."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


class GrpcServer:
    """A ``grpc.server`` with health, message limits and graceful stop; ``start()`` binds.

    ``what`` names the server in bind errors ("cannot bind PS server to ...");
    ``pool_class`` is the thread pool that runs the RPCs (one task per RPC).
    """

    def __init__(
        self,
        *,
        what: str,
        service_name: str,
        host: str,
        port: int,
        max_workers: int,
        thread_name_prefix: str,
        max_message_bytes: int,
        credentials: grpc.ServerCredentials | None = None,
        pool_class: Callable[..., futures.ThreadPoolExecutor] = futures.ThreadPoolExecutor,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
        max_inflight_bytes: int = 0,
        max_concurrent_rpcs: int | None = None,
        health_port: int | None = None,
    ) -> None:
        self.host = host
        self._what = what
        self._service_name = service_name
        self._credentials = credentials
        self._requested_port = port
        self._pool = pool_class(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._server = grpc.server(
            self._pool,
            options=[*message_options(max_message_bytes), ("grpc.so_reuseport", 0)],
            # The budget is outermost: it must see every request it admitted finish, also
            # one an inner interceptor refuses.
            interceptors=[RequestBudget(max_inflight_bytes), *interceptors],
            # Beyond this many RPCs queued or running, grpc answers RESOURCE_EXHAUSTED
            # "Concurrent RPC limit exceeded!" at once; clients back off and retry
            # (``streamtrain_ps.client.rpc``).
            maximum_concurrent_rpcs=max_concurrent_rpcs,
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        # Kubelet's gRPC probes speak no TLS: a TLS server also answers health, and only
        # health, in plaintext on its own port.
        self._health_port = health_port
        #: The plaintext health port once bound (``None``: health on the main port only).
        self.health_port: int | None = None
        self._health_server: grpc.Server | None = None
        if health_port is not None and credentials is not None:
            self._health_server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"),
                options=[("grpc.so_reuseport", 0)],
            )
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__}.start() has not been called")
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> int:
        """Bind, start serving and report SERVING; returns the bound port."""
        target = f"{self.host}:{self._requested_port}"
        try:
            if self._credentials is None:
                port = self._server.add_insecure_port(target)
            else:
                port = self._server.add_secure_port(target, self._credentials)
        except RuntimeError as exc:  # grpc raises when the address cannot be bound
            raise OSError(f"cannot bind {self._what} to {target}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind {self._what} to {target}")
        if self._health_server is not None:
            health_target = f"{self.host}:{self._health_port}"
            try:
                bound = self._health_server.add_insecure_port(health_target)
            except RuntimeError:
                bound = 0
            if bound == 0:
                raise OSError(f"cannot bind {self._what} health to {health_target}")
            self.health_port = bound
            self._health_server.start()
        self._port = port
        self._server.start()
        for service in ("", self._service_name):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return port

    def stop(self, grace: float | None = 5.0) -> threading.Event:
        """Report NOT_SERVING, refuse new RPCs, finish in-flight ones within ``grace``.
        The returned event is set once the server has fully stopped."""
        self.health.enter_graceful_shutdown()
        done: threading.Event = self._server.stop(grace)
        if self._health_server is not None:
            self._health_server.stop(grace)
        return done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (``True``) or ``timeout`` passes (``False``)."""
        return bool(self._server.wait_for_termination(timeout))

    def close(self, grace: float | None = 5.0) -> None:
        """Stop and wait, then release the thread pool."""
        self.stop(grace).wait()
        self._pool.shutdown(wait=True)


@contextmanager
def stop_on_signals(grace: float) -> Iterator[threading.Event]:
    """An event set on SIGTERM or SIGINT while the block runs (main thread only).

    The handler only sets the event: stopping from inside a signal handler would run grpc's
    shutdown re-entrantly on the main thread's stack. The previous handlers come back when
    the block exits, so a second signal during the graceful stop is still just logged.
    """
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping within %.1fs", signal.Signals(signum).name, grace)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def started(server: GrpcServer) -> bool:
    """Start ``server``; a port that cannot be bound is printed to stderr and gives False
    (the process then exits 1: its launcher shows the line)."""
    try:
        server.start()
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def serve_metrics(port: int | None, host: str, registry: CollectorRegistry) -> Any:
    """Serve ``registry`` at ``http://host:port/metrics`` in a daemon thread (port 0 picks a
    free one: the returned server's ``server_port``); ``None`` without a port. Stop it with
    ``shutdown()``."""
    if port is None:
        return None
    http, _ = start_http_server(port, addr=host, registry=registry)
    return http


def exit_now(code: int) -> NoReturn:
    """End the process once a server has stopped and closed what it holds: flush the logs
    and stdio, then ``os._exit`` without the interpreter's teardown.

    The teardown frees every module and object one by one, which with torch (and numba)
    loaded took 1.8-4.7 s after a worker had answered SIGTERM within milliseconds — time
    that local mode waits at the end of every ``streamtrain run`` and Kubernetes at every
    pod stop. Nothing is lost by skipping it: the servers close their channels, thread
    pools and files before returning (every save is on storage before it is reported).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to flush
            stream.flush()
    os._exit(code)
