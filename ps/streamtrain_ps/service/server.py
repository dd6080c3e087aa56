"""Build, run and stop one PS shard's gRPC server.

``PSServer`` wires a ``Shard`` into a ``grpc.server`` with a thread pool, the message limits
of ``PSConfig.maxMessageBytes`` (grpc itself rejects a bigger message with
``RESOURCE_EXHAUSTED`` before it reaches Python), the standard ``grpc.health.v1`` service and
``PSServicer`` (the skeleton is ``streamtrain_ps.plumbing.grpc_serving.GrpcServer``, shared with the
worker's control server). Binding port 0 picks a free port and ``PSServer.port`` reports it,
so tests and local launchers never race for a fixed port. ``stop(grace)`` first flips health to
NOT_SERVING (so Kubernetes and clients stop sending), then lets in-flight RPCs finish for up
to ``grace`` seconds. ``serve_until`` is what ``python -m streamtrain_ps`` runs.
"""

from __future__ import annotations

import functools
import logging
import threading

from prometheus_client import CollectorRegistry

from streamtrain_ps.config import PSConfig
from streamtrain_ps.plumbing.grpc_serving import GrpcServer, message_options
from streamtrain_ps.plumbing.heap import ScratchReleasingExecutor, release_scratch_memory
from streamtrain_ps.plumbing.tls import PeerPolicy, TLSFiles, authorising_interceptor
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service.metrics import PSMetrics
from streamtrain_ps.service.servicer import PSServicer, ShardLike

log = logging.getLogger(__name__)

SERVICE_NAME: str = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
DEFAULT_WORKERS = 16
#: RPCs queued or running per RPC thread before grpc answers RESOURCE_EXHAUSTED (retried).
#: Generous: one client's big pull is many chunks sent at once, and a queued RPC holds only
#: its flow-control window; the request-bytes cap is what bounds memory.
QUEUED_PER_THREAD = 64


def channel_options(config: PSConfig) -> list[tuple[str, int]]:
    """gRPC options shared by the server and ``RemotePS`` channels: one message limit."""
    return message_options(config.maxMessageBytes)


class PSServer(GrpcServer):
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
        peers: PeerPolicy | None = None,
        health_port: int | None = None,
    ) -> None:
        # Credentials are built first, so a bad TLS file fails before anything binds.
        credentials = tls.server_credentials() if tls is not None else None
        interceptors = [authorising_interceptor(peers)] if peers is not None else []
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = PSMetrics(self.registry, shard_index, stats=shard.stats)
        super().__init__(
            what="PS server",
            service_name=SERVICE_NAME,
            host=host,
            port=port,
            max_workers=max_workers,
            thread_name_prefix="ps-rpc",
            max_message_bytes=config.maxMessageBytes,
            credentials=credentials,
            interceptors=interceptors,
            health_port=health_port,
            max_inflight_bytes=config.inflight_bytes,
            max_concurrent_rpcs=QUEUED_PER_THREAD * max_workers,
            # Bulk requests trim the heap once their buffers are freed (heap.py); a capped
            # shard then checks its RSS against its memory split (``Shard.release_memory``).
            pool_class=functools.partial(
                ScratchReleasingExecutor,
                release=getattr(shard, "release_memory", release_scratch_memory),
            ),
        )
        ps_pb2_grpc.add_ParameterServerServicer_to_server(
            PSServicer(shard, config, self.metrics), self._server
        )

    def start(self) -> int:
        """Bind, start serving and report SERVING; returns the bound port."""
        port = super().start()
        log.info("PS shard serving on %s", self.address)
        return port


def serve_until(server: PSServer, stop: threading.Event, grace: float) -> None:
    """Run until ``stop`` is set (``grpc_serving.stop_on_signals``: SIGTERM or SIGINT),
    then stop gracefully."""
    stop.wait()
    server.close(grace)
    log.info("PS shard on %s stopped", server.address)
