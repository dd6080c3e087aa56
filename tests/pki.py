"""The tests' certificate authority for mutual TLS (``trustme``), importable as ``pki``.

``make_pki(dir)`` issues one CA and three leaf certificates, each a ``TLSFiles`` trusting the
CA: a server certificate for 127.0.0.1 (the PS shard or worker under test), the operator's
(identity ``OPERATOR``) and a job's pods' (identity ``JOB``, as the operator renders it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from streamtrain_ps.plumbing.tls import TLSFiles

OPERATOR = "streamtrain-operator"
JOB = "demo.default.job.streamtrain.io"


@dataclass(frozen=True)
class PKI:
    ca: Path
    server: TLSFiles
    operator: TLSFiles
    job: TLSFiles
    #: Trusts the CA but presents no certificate.
    anonymous: TLSFiles


def _leaf(ca: trustme.CA, root: Path, name: str, *identities: str) -> TLSFiles:
    leaf = ca.issue_cert(*identities, common_name=identities[0])
    cert, key = root / f"{name}.pem", root / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return TLSFiles(cert=cert, key=key, ca=root / "ca.pem")


def make_pki(root: Path) -> PKI:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    return PKI(
        ca=root / "ca.pem",
        # The job's pods serve with the job's certificate, so the server holds JOB too.
        server=_leaf(ca, root, "server", "127.0.0.1", JOB),
        operator=_leaf(ca, root, "operator", OPERATOR),
        job=_leaf(ca, root, "job", JOB),
        anonymous=TLSFiles(ca=root / "ca.pem"),
    )
