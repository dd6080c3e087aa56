"""Optional TLS between RemotePS and PS servers (``streamtrain_ps.plumbing.tls``), with certificates
made in the test by ``cryptography``: a CA, a server certificate for 127.0.0.1, a client
certificate, and an unrelated CA. Plain clients, clients that trust the wrong CA and (with
mutual TLS) clients without a certificate are refused; the right client pulls and pushes."""

from __future__ import annotations

import datetime as dt
import ipaddress
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import PSError
from streamtrain_ps.plumbing.tls import TLSConfigError, TLSFiles
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard

from .conftest import PS_SOURCE_ROOT, SpawnedPS, small_config

T = "embedding"
FAIL_FAST = RetryPolicy(max_attempts=1, initial_backoff=0.01, total_seconds=1, rpc_timeout=3)


@dataclass(frozen=True)
class PKI:
    ca: Path
    server: TLSFiles
    client: TLSFiles
    other_ca: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _cert(
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    san: list[x509.GeneralName] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer_name, issuer_key = issuer if issuer is not None else (_name(subject), key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _cert("streamtrain test CA", None, ca=True)
    _write(d / "ca", ca_key, ca_cert)
    issuer = (ca_cert.subject, ca_key)
    san: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    _write(d / "server", *_cert("ps-0", issuer, san=san))
    _write(d / "client", *_cert("worker-0", issuer))
    other_key, other_cert = _cert("someone else's CA", None, ca=True)
    _write(d / "other", other_key, other_cert)
    return PKI(
        ca=d / "ca.pem",
        server=TLSFiles(cert=d / "server.pem", key=d / "server.key"),
        client=TLSFiles(cert=d / "client.pem", key=d / "client.key", ca=d / "ca.pem"),
        other_ca=d / "other.pem",
    )


def _serve(tls: TLSFiles) -> PSServer:
    cfg = small_config()
    server = PSServer(Shard(cfg), cfg, tls=tls)
    server.start()
    return server


def _round_trip(ps: RemotePS) -> None:
    keys = np.array([1, 2, 3], np.uint64)
    ps.push_sparse(
        T,
        SparsePush(
            keys,
            np.full((3, 5), 0.1, np.float32),
            np.ones(3, np.float32),
            np.array([1, 0, 1], np.float32),
        ),
    )
    rows = ps.pull_sparse(T, keys)
    np.testing.assert_array_equal(rows[:, 0], [1, 1, 1])
    np.testing.assert_array_equal(rows[:, 1], [1, 0, 1])


def _refused(address: str, tls: TLSFiles | None) -> None:
    with (
        RemotePS([address], small_config(), retry=FAIL_FAST, tls=tls) as ps,
        pytest.raises(PSError),
    ):
        ps.wait_ready(timeout=2)
        ps.pull_sparse(T, np.array([1], np.uint64))


def test_server_tls_serves_verified_clients_only(pki: PKI) -> None:
    server = _serve(pki.server)
    try:
        with RemotePS([server.address], small_config(), tls=TLSFiles(ca=pki.ca)) as ps:
            ps.wait_ready(timeout=10)
            _round_trip(ps)
        _refused(server.address, None)  # plaintext
        _refused(server.address, TLSFiles(ca=pki.other_ca))  # does not trust the server
    finally:
        server.close(grace=0)


def test_mutual_tls_requires_a_client_certificate_from_the_ca(pki: PKI) -> None:
    server = _serve(TLSFiles(cert=pki.server.cert, key=pki.server.key, ca=pki.ca))
    try:
        with RemotePS([server.address], small_config(), tls=pki.client) as ps:
            ps.wait_ready(timeout=10)
            _round_trip(ps)
        _refused(server.address, TLSFiles(ca=pki.ca))  # no client certificate
    finally:
        server.close(grace=0)


def test_bad_tls_files_are_clear_errors(pki: PKI, tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match="go together"):
        TLSFiles(cert=pki.server.cert)
    with pytest.raises(TLSConfigError, match=r"--tls-key .*missing\.key"):
        TLSFiles(cert=pki.server.cert, key=tmp_path / "missing.key").server_credentials()
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(TLSConfigError, match=r"--tls-ca .*not a PEM"):
        TLSFiles(ca=junk).channel_credentials()
    proc = subprocess.run(
        [sys.executable, "-m", "streamtrain_ps", "--port", "0", "--tls-cert", str(junk)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PS_SOURCE_ROOT,
        check=False,
    )
    assert proc.returncode == 2 and "--tls-cert and --tls-key" in proc.stderr


def test_the_ps_process_serves_tls_from_its_flags(
    pki: PKI, spawn_ps: Callable[..., SpawnedPS]
) -> None:
    assert pki.server.cert is not None and pki.server.key is not None
    child = spawn_ps(
        small_config(),
        "--tls-cert",
        str(pki.server.cert),
        "--tls-key",
        str(pki.server.key),
        "--tls-ca",
        str(pki.ca),
    )
    with RemotePS([child.address], small_config(), tls=pki.client) as ps:
        ps.wait_ready(timeout=20)
        _round_trip(ps)
    _refused(child.address, TLSFiles(ca=pki.ca))
