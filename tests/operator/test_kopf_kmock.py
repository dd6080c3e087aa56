"""The real operator (``kopf run -m streamtrain_operator.main --standalone``) under
``kopf.testing.KopfRunner`` against KMock, the kopf author's Kubernetes API emulator:
CR created -> children created -> status advances -> CR deleted -> finalizer released.

KMock is a database over HTTP: no garbage collection, no selectors, no schema validation
(those are tested elsewhere). It does not stamp ``uid`` or ``resourceVersion`` either, so
the emulator below does, as the API server would.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web_runner
import kmock
import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "streamtrain.io", "v1alpha1", "streamingtrainingjobs"
#: What the operator creates or reads, declared so that listing them before any exists works.
CHILDREN = {
    "v1/configmaps": "ConfigMap",
    "v1/services": "Service",
    "v1/pods": "Pod",
    "v1/events": "Event",
    "apps/v1/statefulsets": "StatefulSet",
    "networking.k8s.io/v1/networkpolicies": "NetworkPolicy",
}


class StampingEmulator(kmock.KubernetesEmulator):
    """Stamps uid, resourceVersion, generation and creationTimestamp like an API server."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)

    async def _handle(self, request: Any) -> Any:
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ"))
            if request.action in (kmock.action.CREATE, kmock.action.UPDATE):
                meta["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)


class PromptTestServer(aiohttp.test_utils.RawTestServer):
    """aiohttp's test server with a short graceful shutdown.

    aiohttp waits up to 60 s for in-flight handlers when it stops; a watch stream whose
    client (kopf) has already gone can sit there that long on a slow machine. Two seconds
    is plenty for an emulator: anything still running after that is cancelled.
    """

    async def _make_runner(self, **kwargs: Any) -> aiohttp.web_runner.ServerRunner:
        runner = await super()._make_runner(**kwargs)
        runner._shutdown_timeout = 2.0  # BaseRunner's own knob; ServerRunner passes no kwarg
        return runner


class Cluster:
    """KMock served from its own thread and event loop (kopf runs in another)."""

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),))

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with (
            StampingEmulator() as emulator,
            kmock.Server(emulator, server_cls=PromptTestServer) as server,
        ):
            emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
                kind="StreamingTrainingJob",
                singular="streamingtrainingjob",
                namespaced=True,
                shortnames={"stj"},
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                subresources={"status"},
            )
            emulator.resources["v1/namespaces"] = kmock.ResourceInfo(
                kind="Namespace", namespaced=False, verbs={"get", "list", "watch"}
            )
            for resource, kind in CHILDREN.items():
                emulator.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=True)
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Cluster:
        self._thread.start()
        assert self._ready.wait(30), "KMock did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._thread.is_alive():  # pragma: no cover - a hang is a failure, said plainly
            raise AssertionError("KMock did not shut down within 30 s")
        self._loop.close()


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cluster, client.ApiClient]]:
    with Cluster() as c:
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
        obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, "ads", PLURAL, name
        )
        return obj
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def test_operator_lifecycle_against_kmock(cluster: tuple[Cluster, client.ApiClient]) -> None:
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
        assert {s.metadata.name for s in services} == {"ctr-online-ps", "ctr-online-worker"}

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
