"""``Kube`` applies and deletes a job's cert-manager Certificate like its built-in children
(create, merge-patch on 409, delete; 404 is "already gone"), against the KMock API server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kubernetes import client

from faults.kmock_api import ApiServer
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.kube import resources as r
from streamtrain_operator.kube.api import Kube

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kube() -> Iterator[Kube]:
    with ApiServer() as server:
        configuration = client.Configuration()
        configuration.host = server.url
        api = client.ApiClient(configuration)
        try:
            yield Kube(api, request_timeout=10)
        finally:
            api.close()


def test_a_jobs_certificate_is_created_patched_and_deleted(kube: Kube) -> None:
    job = load_job(ROOT / "crds/examples/ctr-online.yaml")
    options = r.Options(tls="cert-manager")
    owner = r.Owner(job.name, "6f0e0c8a-4b8f-4d2e-8d43-0c6f1b2a9e11")
    cert = r.certificate(job, 1, owner, options)
    assert kube.apply(cert) == "created"
    renewed = r.certificate(
        job, 1, owner, replace(options, tls_issuer={"kind": "ClusterIssuer", "name": "x"})
    )
    assert kube.apply(renewed) == "patched"
    stored = client.CustomObjectsApi(kube.api).get_namespaced_custom_object(
        "cert-manager.io", "v1", job.namespace, "certificates", f"{job.name}-tls"
    )
    assert stored["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "x"}
    assert stored["spec"]["dnsNames"][0] == r.job_identity(job)
    assert kube.delete("Certificate", job.namespace, f"{job.name}-tls") is True
    assert kube.delete("Certificate", job.namespace, f"{job.name}-tls") is False
