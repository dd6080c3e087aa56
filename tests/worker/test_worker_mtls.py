"""Mutual TLS on the worker's control port: every method is the scheduler's, so only the
operator's certificate may call it. A job pod's certificate is refused Reset and RunPass
(PERMISSION_DENIED), a client without a certificate is refused at the handshake, and the
operator's own client (``GrpcWorker``, as the driver dials it) is accepted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pki import OPERATOR, PKI, make_pki
from streamtrain_operator.run.worker_client import GrpcWorker
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.plumbing.tls import PeerPolicy, TLSFiles
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.service import CONTROL_METHODS, WorkerServer, WorkerServicer
from streamtrain_worker.proto import worker_pb2, worker_pb2_grpc

CONFIG = {
    "data": {"format": "criteo"},
    "model": {"hiddenUnits": [8], "batchSize": 16},
    "ps": {"config": {"logicalShards": 8}, "maxRetrySeconds": 1.0, "timeoutSeconds": 5.0},
}


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path)


@pytest.fixture
def server(pki: PKI) -> Iterator[WorkerServer]:
    config = WorkerConfig.from_dict(CONFIG)
    ps = LocalPS(config.ps.config)
    srv = WorkerServer(
        WorkerServicer(config, ps),
        tls=pki.server,
        peers=PeerPolicy.of([OPERATOR], [], CONTROL_METHODS),
    )
    srv.start()
    yield srv
    srv.close(grace=0)
    ps.close()


def _stub(server: WorkerServer, tls: TLSFiles) -> tuple[grpc.Channel, worker_pb2_grpc.WorkerStub]:
    channel = grpc.secure_channel(server.address, tls.channel_credentials())
    return channel, worker_pb2_grpc.WorkerStub(channel)


def test_a_job_certificate_is_refused_every_worker_method(server: WorkerServer, pki: PKI) -> None:
    channel, stub = _stub(server, pki.job)
    with channel:
        for call in (
            lambda: stub.Reset(worker_pb2.ResetRequest(generation=99), timeout=10),
            lambda: stub.RunPass(
                worker_pb2.RunPassRequest(day="20260101", generation=99), timeout=10
            ),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "not authorised" in (err.value.details() or "")


def test_a_client_without_a_certificate_is_refused(server: WorkerServer, pki: PKI) -> None:
    channel, stub = _stub(server, pki.anonymous)
    with channel, pytest.raises(grpc.RpcError) as err:
        stub.Reset(worker_pb2.ResetRequest(generation=1), timeout=10)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE


def test_the_operator_client_is_accepted(server: WorkerServer, pki: PKI) -> None:
    async def reset() -> None:
        worker = GrpcWorker(server.address, tls=pki.operator, control_timeout=10)
        try:
            await worker.wait_ready(10)
            await worker.reset(7)
        finally:
            await worker.close()

    asyncio.run(reset())


def test_export_dense_is_held_to_the_jobs_storage_roots(pki: PKI, tmp_path: Path) -> None:
    """The worker checks an ExportDense URI as a PS shard checks a Save: the roots and
    schemes of the PS config the operator renders into the worker's (``storage_policy``)."""
    config = WorkerConfig.from_dict(
        {
            **CONFIG,
            "ps": {
                **CONFIG["ps"],
                "config": {"logicalShards": 8, "storageRoots": [str(tmp_path / "export")]},
            },
        }
    )
    ps = LocalPS(config.ps.config)
    server = WorkerServer(WorkerServicer(config, ps))
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            for uri in (
                str(tmp_path / "elsewhere"),
                f"{tmp_path}/export/d?x=",
                "http://169.254.169.254/x",
            ):
                with pytest.raises(grpc.RpcError) as err:
                    stub.ExportDense(worker_pb2.ExportDenseRequest(uri=uri), timeout=30)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert repr(uri) in (err.value.details() or "")
        assert not (tmp_path / "elsewhere").exists()
    finally:
        server.close(grace=0)
        ps.close()
