"""Mutual TLS with authorisation on a PS shard (``streamtrain_ps.plumbing.tls.PeerPolicy``):
a client without a certificate is refused at the handshake, a job pod's certificate pulls and pushes
but is refused the control methods (PERMISSION_DENIED), the operator's is accepted for both;
health answers in plaintext on its own port for kubelet."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pki import JOB, OPERATOR, PKI, make_pki
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.kube import resources as r
from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import PSError
from streamtrain_ps.plumbing.tls import PeerPolicy
from streamtrain_ps.service.server import SERVICE_NAME, PSServer
from streamtrain_ps.service.servicer import CONTROL_METHODS
from streamtrain_ps.shard import Shard

from .conftest import SpawnedPS, small_config

ROOT = Path(__file__).resolve().parents[2]
T = "embedding"
# One attempt; the first pull may compile kernels, so no short deadline.
FAIL_FAST = RetryPolicy(max_attempts=1, initial_backoff=0.01, total_seconds=1, rpc_timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def server(pki: PKI) -> Iterator[PSServer]:
    config = small_config()
    shard = Shard(config)
    srv = PSServer(
        shard,
        config,
        tls=pki.server,
        peers=PeerPolicy.of([OPERATOR], [JOB], CONTROL_METHODS),
        health_port=0,
    )
    srv.start()
    yield srv
    srv.close(grace=0)
    shard.close()


def _client(server: PSServer, tls: object) -> RemotePS:
    return RemotePS([server.address], small_config(), retry=FAIL_FAST, tls=tls)  # type: ignore[arg-type]


def test_a_client_without_a_certificate_is_refused(server: PSServer, pki: PKI) -> None:
    client = _client(server, pki.anonymous)
    try:
        with pytest.raises(PSError):
            client.pull_sparse(T, np.arange(1, 5, dtype=np.uint64))
    finally:
        client.close()
    plain = RemotePS([server.address], small_config(), retry=FAIL_FAST)
    try:
        with pytest.raises(PSError):
            plain.pull_sparse(T, np.arange(1, 5, dtype=np.uint64))
    finally:
        plain.close()


def test_a_job_certificate_pulls_and_pushes_but_is_refused_control(
    server: PSServer, pki: PKI, tmp_path: Path
) -> None:
    client = _client(server, pki.job)
    try:
        keys = np.arange(1, 9, dtype=np.uint64)
        assert client.pull_sparse(T, keys).shape[0] == keys.size
        for call in (
            lambda: client.save(str(tmp_path / "ckpt"), SaveMode.CHECKPOINT),
            client.shrink,
            lambda: client.load(str(tmp_path / "ckpt")),
        ):
            with pytest.raises(PSError, match=r"PERMISSION_DENIED.*not authorised"):
                call()
        assert not (tmp_path / "ckpt").exists()
    finally:
        client.close()


def test_the_operator_certificate_is_accepted_for_control_and_audited(
    server: PSServer, pki: PKI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = _client(server, pki.operator)
    try:
        client.pull_sparse(T, np.arange(1, 9, dtype=np.uint64))
        with caplog.at_level(logging.INFO, logger="streamtrain_ps.service.servicer"):
            result = client.save(str(tmp_path / "ckpt"), SaveMode.CHECKPOINT)
            client.shrink()
        assert result.files
    finally:
        client.close()
    audit = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    uri = str(tmp_path / "ckpt")
    assert any(m.startswith(f"Save {uri} requested by ") and OPERATOR in m for m in audit)
    assert any(m.startswith("Shrink all tables requested by ") and OPERATOR in m for m in audit)


def test_health_answers_in_plaintext_on_its_own_port_only(server: PSServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:  # nothing but health on that port
            channel.unary_unary(f"/{SERVICE_NAME}/Stats")(b"", timeout=5)
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_the_operators_rendered_tls_flags_run_a_shard_process(
    spawn_ps: Callable[..., SpawnedPS], pki: PKI, tmp_path: Path
) -> None:
    """``python -m streamtrain_ps`` with the TLS flags exactly as the operator renders them
    (the mount path pointed at this test's certificates, the job's identity this test's):
    the job certificate pulls but may not save, the operator's saves (the health port is
    bound to a free one here; health over it is covered above, in process)."""
    job = load_job(ROOT / "crds/examples/minimal.yaml")
    options = r.Options(tls="cert-manager", operator_identity=OPERATOR)
    mount = {
        f"{r.TLS_DIR}/tls.crt": str(pki.server.cert),
        f"{r.TLS_DIR}/tls.key": str(pki.server.key),
        f"{r.TLS_DIR}/ca.crt": str(pki.ca),
        r.job_identity(job): JOB,
        str(options.health_port): "0",
    }
    args = [mount.get(a, a) for a in r.tls_args(job, "ps", options)]
    assert "--tls-data-peer" in args and OPERATOR in args
    ps = spawn_ps(small_config(), *args)
    for tls, allowed in ((pki.job, False), (pki.operator, True)):
        client = RemotePS([ps.address], small_config(), retry=FAIL_FAST, tls=tls)
        try:
            client.pull_sparse(T, np.arange(1, 9, dtype=np.uint64))
            uri = str(tmp_path / f"ckpt-{allowed}")
            if allowed:
                assert client.save(uri, SaveMode.CHECKPOINT).files
            else:
                with pytest.raises(PSError, match="PERMISSION_DENIED"):
                    client.save(uri, SaveMode.CHECKPOINT)
        finally:
            client.close()
