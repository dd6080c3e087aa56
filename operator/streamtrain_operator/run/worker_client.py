"""The scheduler's gRPC client of the worker control service (``worker.proto``).

The only module on the operator side that talks to workers. Calls are ``grpc.aio``, so a
pass runs on every worker concurrently from one event loop. A ``RunPass`` blocks for the
whole share of a pass, so it carries no deadline of its own (``passTimeoutSeconds`` is
applied by the driver); the control calls get ``control_timeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from streamtrain_ps.plumbing.grpc_serving import RECONNECT_OPTIONS
from streamtrain_ps.plumbing.tls import TLSFiles
from streamtrain_worker.proto import worker_pb2, worker_pb2_grpc
from streamtrain_worker.proto.share import PassShare

#: PassResult carries two histograms of up to 2^20 buckets x 8 bytes each.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class GrpcWorker:
    """``WorkerClient`` over one worker's control endpoint (``host:port``)."""

    def __init__(
        self,
        endpoint: str,
        name: str = "",
        control_timeout: float = 600.0,
        connect_timeout: float = 60.0,
        tls: TLSFiles | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = name or endpoint
        self.control_timeout = control_timeout
        self.connect_timeout = connect_timeout
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *RECONNECT_OPTIONS,
        ]
        if tls is None:
            self._channel = grpc.aio.insecure_channel(endpoint, options=options)
        else:  # the operator's certificate: the identity workers admit control calls from
            self._channel = grpc.aio.secure_channel(
                endpoint, tls.channel_credentials(), options=options + tls.channel_options()
            )
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the channel connects (raises ``TimeoutError``)."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    async def run_pass(self, share: PassShare) -> Any:
        await self.wait_ready(self.connect_timeout)  # e.g. a worker that just restarted
        return await self._stub.RunPass(share.to_request())

    async def export_dense(self, uri: str, snapshot_id: str = "") -> list[str]:
        response = await self._stub.ExportDense(
            worker_pb2.ExportDenseRequest(uri=uri, snapshot_id=snapshot_id),
            timeout=self.control_timeout,
        )
        return list(response.files)

    async def reset(self, generation: int) -> None:
        request = worker_pb2.ResetRequest(generation=generation)
        await self._stub.Reset(request, timeout=self.control_timeout)

    async def close(self) -> None:
        await self._channel.close()
