"""Opt-in checks against a real Kubernetes cluster (``STREAMTRAIN_CLUSTER=1``, current
kubeconfig context): what no emulator does — the API server's structural schema, defaulting
and CEL rules (including the ``oldSelf`` transition rules) — on the generated CRD."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from streamtrain_tools import crdgen

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = crdgen.GROUP, crdgen.VERSION, crdgen.PLURAL

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get("STREAMTRAIN_CLUSTER") != "1",
        reason="real-cluster tests are opt-in: STREAMTRAIN_CLUSTER=1",
    ),
]


@pytest.fixture(scope="module")
def api() -> Iterator[client.ApiClient]:
    config.load_kube_config()
    api = client.ApiClient()
    ext = client.ApiextensionsV1Api(api)
    crd = yaml.safe_load((ROOT / crdgen.CRD_FILE).read_text())
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(crdgen.CRD_NAME)
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crdgen.CRD_NAME, crd)
    yield api
    api.close()


def _example(name: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((ROOT / "crds/examples" / name).read_text())
    manifest["metadata"]["namespace"] = "default"
    manifest["metadata"]["name"] = f"stj-{uuid.uuid4().hex[:8]}"
    return manifest


def _create(api: client.ApiClient, manifest: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    kwargs = {"dry_run": "All"} if dry_run else {}
    obj: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, manifest, **kwargs
    )
    return obj


@pytest.mark.parametrize("example", ["ctr-online.yaml", "minimal.yaml", "avazu-deepfm.yaml"])
def test_examples_are_admitted_and_defaulted(api: client.ApiClient, example: str) -> None:
    created = _create(api, _example(example), dry_run=True)
    spec = created["spec"]
    assert spec["ps"]["logicalShards"] >= 1  # the server applied the schema's defaults
    assert spec["suspend"] is False


def test_cel_rejects_end_before_start(api: client.ApiClient) -> None:
    bad = _example("ctr-online.yaml")
    bad["spec"]["data"]["endDay"] = "20261031"
    with pytest.raises(ApiException) as error:
        _create(api, bad, dry_run=True)
    assert error.value.status == 422
    assert "endDay must be >= startDay" in str(error.value.body)


def test_ps_replicas_change_only_while_suspended(api: client.ApiClient) -> None:
    crs = client.CustomObjectsApi(api)
    manifest = _example("ctr-online.yaml")
    name = manifest["metadata"]["name"]
    _create(api, manifest, dry_run=False)
    try:
        with pytest.raises(ApiException) as error:
            crs.patch_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, name, {"spec": {"ps": {"replicas": 3}}}
            )
        assert "ps.replicas can only change while the job is suspended" in str(error.value.body)
        crs.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, name, {"spec": {"suspend": True}}
        )
        crs.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, name, {"spec": {"ps": {"replicas": 3}}}
        )
    finally:
        crs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
