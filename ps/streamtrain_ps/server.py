"""Build, run and stop one PS shard's gRPC server.

``PSServer`` wires a ``Shard`` into a ``grpc.server`` with a thread pool, the message limits
of ``PSConfig.maxMessageBytes`` (grpc itself rejects a bigger message with
``RESOURCE_EXHAUSTED`` before it reaches Python), the standard ``grpc.health.v1`` service and
``PSServicer``. Binding port 0 picks a free port and ``PSServer.port`` reports it, so tests and
local launchers never race for a fixed port. ``stop(grace)`` first flips health to
NOT_SERVING (so Kubernetes and clients stop sending), then lets in-flight RPCs finish for up
to ``grace`` seconds. ``serve_until_signal`` is what ``python -m streamtrain_ps`` runs.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from streamtrain_ps.config import PSConfig
from streamtrain_ps.metrics import PSMetrics
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.servicer import PSServicer, ShardLike
from streamtrain_ps.tls import TLSFiles

log = logging.getLogger(__name__)

SERVICE_NAME: str = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
DEFAULT_WORKERS = 16


def channel_options(config: PSConfig) -> list[tuple[str, int]]:
    """gRPC options shared by the server and ``RemotePS`` channels: one message limit."""
    return [
        ("grpc.max_receive_message_length", config.maxMessageBytes),
        ("grpc.max_send_message_length", config.maxMessageBytes),
    ]


class PSServer:
    """One shard served over gRPC; ``start()`` binds and returns the port."""

    def __init__(
        self,
        shard: ShardLike,
        config: PSConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = DEFAULT_WORKERS,
        registry: CollectorRegistry | None = None,
        shard_index: int = 0,
        tls: TLSFiles | None = None,
    ) -> None:
        self.host = host
        # Credentials are built now, so a bad TLS file fails before anything binds.
        self._credentials = tls.server_credentials() if tls is not None else None
        self._requested_port = port
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = PSMetrics(self.registry, shard_index, stats=shard.stats)
        self._pool = futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="ps-rpc"
        )
        self._server = grpc.server(
            self._pool,
            # Without so_reuseport two servers could bind the same explicit port silently.
            options=[*channel_options(config), ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=None,
        )
        ps_pb2_grpc.add_ParameterServerServicer_to_server(
            PSServicer(shard, config, self.metrics), self._server
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("PSServer.start() has not been called")
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
            raise OSError(f"cannot bind PS server to {target}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind PS server to {target}")
        self._port = port
        self._server.start()
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("PS shard serving on %s", self.address)
        return port

    def stop(self, grace: float | None = 5.0) -> threading.Event:
        """Report NOT_SERVING, refuse new RPCs, finish in-flight ones within ``grace``.
        The returned event is set once the server has fully stopped."""
        self.health.enter_graceful_shutdown()
        done: threading.Event = self._server.stop(grace)
        return done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (``True``) or ``timeout`` passes (``False``)."""
        return bool(self._server.wait_for_termination(timeout))

    def close(self, grace: float | None = 5.0) -> None:
        """Stop and wait, then release the thread pool."""
        self.stop(grace).wait()
        self._pool.shutdown(wait=True)


def serve_until_signal(server: PSServer, grace: float) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully (main thread only).

    The handler only sets an event: stopping from inside a signal handler would run grpc's
    shutdown re-entrantly on the main thread's stack.
    """
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping within %.1fs", signal.Signals(signum).name, grace)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop.wait()
        server.close(grace)
        log.info("PS shard on %s stopped", server.address)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
