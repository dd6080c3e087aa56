"""Two operators, one job: only the holder of the job's Lease drives it (``kube/lease.py``).

Against KMock (``faults.kmock_api``: it refuses an update whose ``resourceVersion`` is not
the current one, as the API server does) through the operator's real ``Kube`` client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from faults.kmock_api import GROUP, PLURAL, VERSION, ApiServer
from streamtrain_operator.kube.api import Kube
from streamtrain_operator.kube.daemon import JobSupervisor, Runtime
from streamtrain_operator.kube.lease import DriverLease, LeaseConflict, LeaseLost
from streamtrain_operator.kube.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "ads"


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


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def lease(kube: Kube, holder: str, clock: Callable[[], float]) -> DriverLease:
    return DriverLease(kube, NAMESPACE, "ctr-online", holder, clock, duration=30, margin=5)


def test_a_held_lease_is_not_taken_and_an_expired_one_is_taken_once(kube: Kube) -> None:
    clock = Clock()
    a, b = lease(kube, "op-a", clock), lease(kube, "op-b", clock)
    assert a.acquire()
    assert not b.acquire()  # fresh and held by op-a
    clock.now += 20
    a.renew()
    a.check()
    clock.now += 26  # 26 s after the renewal: within the duration, past the margin
    with pytest.raises(LeaseLost):
        a.check()  # a write sent now could land after the Lease expired: refused
    clock.now += 5  # 31 s: expired
    assert b.acquire()
    b.check()
    with pytest.raises(LeaseLost):
        a.renew()  # op-b wrote the Lease: op-a's conditional replace is refused
    stored = kube.read_lease(NAMESPACE, "ctr-online-driver")
    assert stored is not None and stored["spec"]["holderIdentity"] == "op-b"
    b.release()
    assert kube.read_lease(NAMESPACE, "ctr-online-driver")["spec"]["holderIdentity"] in ("", None)  # type: ignore[index]
    assert a.acquire()  # released: no need to wait for the duration


def test_of_two_takeovers_from_one_read_exactly_one_lands(kube: Kube) -> None:
    clock = Clock()
    assert lease(kube, "op-a", clock).acquire()
    seen = kube.read_lease(NAMESPACE, "ctr-online-driver")
    assert seen is not None
    body = {**seen, "spec": {**seen["spec"], "holderIdentity": "op-b"}}
    kube.replace_lease(NAMESPACE, "ctr-online-driver", body)
    with pytest.raises(LeaseConflict):  # same resourceVersion, second writer
        kube.replace_lease(
            NAMESPACE,
            "ctr-online-driver",
            {**seen, "spec": {**seen["spec"], "holderIdentity": "op-c"}},
        )


class Stop:
    """kopf's daemon ``stopped`` flag, settable from the test's thread."""

    def __init__(self) -> None:
        self._flag = threading.Event()

    def set(self) -> None:
        self._flag.set()

    def is_set(self) -> bool:
        return self._flag.is_set()

    async def wait(self) -> None:
        while not self._flag.is_set():
            await asyncio.sleep(0.05)


class NeverReady:
    """A connection to pods that never answer: the supervisor applies the job's children
    and then waits for them (what "driving" looks like without pods)."""

    async def wait_ready(self, timeout: float) -> None:
        await asyncio.sleep(0.05)
        raise ConnectionError("no pods in KMock")

    async def close(self) -> None:
        return None


def test_a_second_operator_does_not_drive_a_job_the_first_holds(kube: Kube) -> None:
    manifest = yaml.safe_load((ROOT / "crds/examples/ctr-online.yaml").read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    crs = client.CustomObjectsApi(kube.api)
    crs.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, manifest)
    body = crs.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "ctr-online")
    first = lease(kube, "op-a", time.time)
    assert first.acquire()
    runtime = Runtime(
        kube=kube,
        metrics=OperatorMetrics(CollectorRegistry()),
        connector=lambda *_: NeverReady(),  # type: ignore[arg-type,return-value]
        ready_timeout=0.1,
        idle_poll_seconds=0.05,
        identity="op-b",
    )
    supervisor = JobSupervisor(runtime, body)
    stop = Stop()
    thread = threading.Thread(target=asyncio.run, args=(supervisor.run(stop),))
    thread.start()
    try:

        def statefulsets() -> list[Any]:
            return client.AppsV1Api(kube.api).list_namespaced_stateful_set(NAMESPACE).items

        # op-b looks again every 50 ms for a second: it never touches the job.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert not statefulsets(), "op-b applied the job's children while op-a held it"
            time.sleep(0.05)
        status = crs.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "ctr-online")
        assert not status.get("status"), "op-b wrote the job's status while op-a held it"
        first.release()  # op-a goes away cleanly: op-b takes the job over at once
        deadline = time.monotonic() + 20
        while not statefulsets():
            assert time.monotonic() < deadline, "op-b did not take the job over"
            time.sleep(0.05)
        stored = kube.read_lease(NAMESPACE, "ctr-online-driver")
        assert stored is not None and stored["spec"]["holderIdentity"] == "op-b"
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    released = kube.read_lease(NAMESPACE, "ctr-online-driver")
    assert released is not None and not released["spec"].get("holderIdentity")
