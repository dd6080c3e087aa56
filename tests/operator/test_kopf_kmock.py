"""The real operator (``kopf run -m streamtrain_operator.main --standalone``) under
``kopf.testing.KopfRunner`` against KMock, the kopf author's Kubernetes API emulator:
CR created -> children created -> status advances -> CR deleted -> finalizer released.

KMock is a database over HTTP: no garbage collection, no schema validation (those are
tested elsewhere). The emulator (``faults.kmock_api``, shared with the operator fault
tests) stamps ``uid`` and ``resourceVersion`` and honours label selectors, as the API
server would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from faults.kmock_api import GROUP, PLURAL, VERSION, ApiServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ApiServer, client.ApiClient]]:
    with ApiServer() as c:
        monkeypatch.setenv("STREAMTRAIN_KUBE_SERVER", c.url)
        monkeypatch.setenv("STREAMTRAIN_METRICS_PORT", "0")
        monkeypatch.setenv("POD_NAMESPACE", "streamtrain-system")
        monkeypatch.setenv("STREAMTRAIN_READY_TIMEOUT_SECONDS", "1")
        configuration = client.Configuration()
        configuration.host = c.url
        api = client.ApiClient(configuration)
        try:
            yield c, api
        finally:
            api.close()


def _until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy (no blind sleeps)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.1)


def _job(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, "ads", PLURAL, name
        )
        return dict(obj)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def test_operator_lifecycle_against_kmock(cluster: tuple[ApiServer, client.ApiClient]) -> None:
    _, api = cluster
    crs = client.CustomObjectsApi(api)
    good = yaml.safe_load((ROOT / "crds/examples/ctr-online.yaml").read_text())
    bad = yaml.safe_load((ROOT / "crds/examples/ctr-online.yaml").read_text())
    bad["metadata"]["name"] = "broken"
    bad["spec"]["data"]["splitIntervalMinutes"] = 7
    args = ["run", "-m", "streamtrain_operator.main", "--standalone", "--all-namespaces"]
    with KopfRunner(args, reraise=False) as runner:
        crs.create_namespaced_custom_object(GROUP, VERSION, "ads", PLURAL, good)
        crs.create_namespaced_custom_object(GROUP, VERSION, "ads", PLURAL, bad)

        # Children created (owner references to the job) ...
        def statefulsets() -> list[Any]:
            items = client.AppsV1Api(api).list_namespaced_stateful_set("ads").items
            return items if len(items) == 2 else []

        sts = _until(statefulsets, "both StatefulSets")
        uid = _job(api, "ctr-online")["metadata"]["uid"]  # type: ignore[index]
        assert {s.metadata.name for s in sts} == {"ctr-online-ps", "ctr-online-worker"}
        assert all(s.metadata.owner_references[0].uid == uid for s in sts)
        assert client.CoreV1Api(api).read_namespaced_config_map("ctr-online-config", "ads").data
        services = client.CoreV1Api(api).list_namespaced_service("ads").items
        names = {s.metadata.name for s in services}  # type: ignore[union-attr]  # always set
        assert names == {"ctr-online-ps", "ctr-online-worker"}

        # ... status advances: spec accepted, then the daemon waits for the pods' gRPC health
        # (KMock runs no pods), saying so in a condition.
        job = _until(
            lambda: (j := _job(api, "ctr-online")) and _condition(j, "PodsReady") and j,
            "the PodsReady condition",
        )
        assert _condition(job, "SpecValid")["status"] == "True"  # type: ignore[index]
        waiting = _condition(job, "PodsReady")
        assert waiting is not None and waiting["reason"] == "WaitingForPods"
        assert job["status"]["phase"] == "Pending"
        assert "streamtrain.io/finalizer" in job["metadata"]["finalizers"]
        assert any(k.startswith("streamtrain.io/") for k in job["metadata"]["annotations"])

        # A bad spec: a permanent failure with a condition naming the field; no children.
        broken = _until(
            lambda: (j := _job(api, "broken")) and _condition(j, "SpecValid") and j,
            "the broken job's SpecValid condition",
        )
        invalid = _condition(broken, "SpecValid")
        assert invalid is not None and invalid["status"] == "False"
        assert invalid["message"].startswith("spec.data.splitIntervalMinutes:")
        assert broken["status"]["phase"] == "Failed"

        # Deleted -> the daemon stops, the finalizer is released, the object goes away.
        for name in ("ctr-online", "broken"):
            crs.delete_namespaced_custom_object(GROUP, VERSION, "ads", PLURAL, name)
        _until(lambda: _job(api, "ctr-online") is None, "ctr-online to be released", 60)
        _until(lambda: _job(api, "broken") is None, "broken to be released", 60)
    assert runner.exception is None, runner.output
    assert runner.exit_code == 0, runner.output
