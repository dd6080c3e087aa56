"""A Kubernetes API for the tests that run the real operator: KMock, served from its own
thread.

Used by the operator-level fault tests (``on_kube.py``) and by
``tests/operator/test_kopf_kmock.py`` (imported there as ``faults.kmock_api``: pytest puts
``tests/`` on the path, see ``pythonpath`` in pyproject.toml) — one emulator, so both test
the operator against the same notion of "an API server".

KMock (the kopf author's API emulator) is an in-memory database over HTTP. The operator
and the test's kubelet (``kubelet.py``) talk to it with the real ``kubernetes`` client and
kopf, from other threads and processes. Three things a real API server does, and which the
operator relies on, are added here, each as small as it can be:

- ``uid``, ``resourceVersion``, ``generation`` and ``creationTimestamp`` are stamped on
  writes (kopf and the owner references need uids), and an update that carries a
  ``resourceVersion`` other than the object's current one is refused with 409 (optimistic
  concurrency: the operator's driver Lease relies on it);
- list requests honour equality ``labelSelector``\\ s (the supervisor tells PS pods from
  worker pods by their ``streamtrain.io/role`` label; without selectors a worker restart
  would look like a PS restart);
- aiohttp's 60 s graceful shutdown is cut to 2 s (a watch whose client was SIGKILLed, or
  kopf's once it stopped, could otherwise hold the teardown that long; on CI that raced
  the event loop's close).

Garbage collection, schema validation and every other server-side behaviour stay absent:
the tests do not depend on them (``tests/operator`` and ``tests/contract`` cover those).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import aiohttp.web_runner
import kmock

GROUP, VERSION, PLURAL = "streamtrain.io", "v1alpha1", "streamingtrainingjobs"
#: Resources the operator and the kubelet use, declared so that an empty list works.
CHILDREN = {
    "v1/configmaps": "ConfigMap",
    "v1/services": "Service",
    "v1/pods": "Pod",
    "v1/events": "Event",
    "apps/v1/statefulsets": "StatefulSet",
    "networking.k8s.io/v1/networkpolicies": "NetworkPolicy",
    "coordination.k8s.io/v1/leases": "Lease",
    "cert-manager.io/v1/certificates": "Certificate",
}


def matches(labels: dict[str, str] | None, selector: str) -> bool:
    """Equality-based label selector (``a=b,c=d``; ``==`` too), as the operator sends."""
    labels = labels or {}
    for term in filter(None, selector.split(",")):
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep:
            raise ValueError(f"labelSelector term {term!r}: only k=v is emulated")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


class Emulator(kmock.KubernetesEmulator):
    """KMock plus uid/resourceVersion stamping and label selectors on lists."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)
        # Held from the precondition check to the write, so two conditional updates
        # cannot both pass the check.
        self._updates = asyncio.Lock()

    async def _handle(self, request: Any) -> Any:
        if request.resource is None or request.action != kmock.action.UPDATE:
            return await self._stamped(request)
        async with self._updates:
            data = request.data if isinstance(request.data, dict) else {}
            wanted = data.get("metadata", {}).get("resourceVersion")
            key = (request.resource, request.namespace, request.name)
            if wanted and key in self._objects and not self._objects[key].deleted:
                current = self._objects[key].get("metadata", {}).get("resourceVersion")
                if str(current) != str(wanted):
                    return aiohttp.web.json_response(
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "reason": "Conflict",
                            "code": 409,
                            "message": f"resourceVersion {wanted} is not {current}",
                        },
                        status=409,
                    )
            return await self._stamped(request)

    async def _stamped(self, request: Any) -> Any:
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

    async def _serve_list(self, request: Any) -> Any:
        payload: Any = await super()._serve_list(request)
        selector = request.params.get("labelSelector", "")
        if selector:
            payload["items"] = [
                item
                for item in payload["items"]
                if matches(item.get("metadata", {}).get("labels"), selector)
            ]
        return payload


class PromptTestServer(aiohttp.test_utils.RawTestServer):
    """aiohttp's test server with a 2 s (not 60 s) graceful shutdown.

    aiohttp waits up to 60 s for in-flight handlers when it stops; a watch stream whose
    client (kopf) has already gone can sit there that long on a slow machine. Two seconds
    is plenty for an emulator: anything still running after that is cancelled.
    """

    async def _make_runner(
        self, debug: bool = True, **kwargs: Any
    ) -> aiohttp.web_runner.ServerRunner:
        runner = await super()._make_runner(debug=debug, **kwargs)
        runner._shutdown_timeout = 2.0  # BaseRunner's own knob; ServerRunner passes no kwarg
        return runner


class ApiServer:
    """The emulator on 127.0.0.1 (a free port), in its own thread and event loop.

    A context manager: ``url`` is set once it serves; leaving stops it (failing loudly if
    it does not stop).
    """

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._serve(),), name="kmock"
        )

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with (
            Emulator() as emulator,
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

    def __enter__(self) -> ApiServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("KMock did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._thread.is_alive():  # a hang is a failure, said plainly
            raise AssertionError("KMock did not shut down within 30 s")
        self._loop.close()
