"""The kopf handlers and the job supervisor, called directly with a fake kube layer, fake
connections and a scripted driver: no kopf runtime, no cluster, no network."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import kopf
import pytest
from fakes import FakeConnection, FakeKube, Memo, Stop, job_body, metric
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import PassRecord, Phase, Progress
from streamtrain_operator.kube import handlers
from streamtrain_operator.kube.daemon import Runtime
from streamtrain_operator.kube.metrics import OperatorMetrics

T0 = 1_795_000_000.0


@dataclass
class Script:
    """What each successive driver does: save these progresses, then end or block."""

    runs: list[tuple[list[Progress], bool]]
    drivers: list[ScriptedDriver] = field(default_factory=list)


class ScriptedDriver:
    def __init__(self, script: Script, spec: Any, ps: Any, workers: Any, store: Any, **kw: Any):
        self.spec, self.store, self.observer = spec, store, kw["observer"]
        self.steps, self.block = script.runs[len(script.drivers)]
        self.stopped = asyncio.Event()
        self.stop_phase = Phase.STOPPED
        self.cancelled = False
        script.drivers.append(self)

    def stop(self, phase: str = Phase.STOPPED, message: str = "") -> None:
        self.stop_phase = phase
        self.stopped.set()

    async def run(self) -> Progress:
        progress = self.store.load() or Progress()
        for progress in self.steps:
            self.store.save(progress)
            self.observer.on_progress(progress)
            await asyncio.sleep(0)
        if self.block:
            try:
                await self.stopped.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            progress = replace(progress, phase=self.stop_phase)
            self.store.save(progress)
        return progress


def _runtime(kube: FakeKube, script: Script, conn: FakeConnection | None = None) -> Runtime:
    return Runtime(
        kube=kube,
        metrics=OperatorMetrics(CollectorRegistry()),
        connector=lambda job, scale, options: conn or FakeConnection(),
        driver_factory=lambda *a, **kw: ScriptedDriver(script, *a, **kw),
        clock=lambda: T0,
        ready_timeout=0.01,
        restart_poll_seconds=0.01,
        idle_poll_seconds=0.01,
    )


def _training(day: str, p: int, generation: int = 1, auc: float = 0.75) -> Progress:
    record = PassRecord(
        day,
        p,
        generation,
        {"auc": auc, "loss": 0.45, "copc": 1.0, "examples": 1000.0, "seconds": 30.0},
        2.0,
    )
    return Progress(
        generation=generation,
        phase=Phase.TRAINING,
        completed=StepKey(day, p, StepKind.TRAIN),
        history=(record,),
    )


async def _reconcile(body: dict[str, Any], memo: Memo) -> None:
    await handlers.reconcile(body=body, meta=body["metadata"], status=body["status"], memo=memo)


# ------------------------------------------------------------------------------ reconcile


def test_create_parses_applies_children_and_reports_a_valid_spec() -> None:
    body = job_body()
    kube = FakeKube(body)
    memo = Memo(runtime=_runtime(kube, Script([])))
    asyncio.run(_reconcile(body, memo))
    assert sorted(kind for kind, _ in kube.objects) == [
        "ConfigMap", "NetworkPolicy", "NetworkPolicy", "Service", "Service", "StatefulSet",
        "StatefulSet",
    ]  # fmt: skip
    assert kube.replicas("ps") == 2 and kube.replicas("worker") == 4
    assert body["status"]["phase"] == "Pending"
    (cond,) = body["status"]["conditions"]
    assert (cond["type"], cond["status"]) == ("SpecValid", "True")
    assert body["status"]["observedGeneration"] == 1
    cm = kube.objects[("ConfigMap", "ctr-online-config")]
    assert set(cm["data"]) == {"ps.json", "worker.json"}
    assert "ctr-online-ps-1.ctr-online-ps.ads.svc:50051" in cm["data"]["worker.json"]


def test_a_bad_spec_is_permanent_and_names_the_field() -> None:
    body = job_body(ps={"replicas": 0})
    kube = FakeKube(body)
    memo = Memo(runtime=_runtime(kube, Script([])))
    with pytest.raises(kopf.PermanentError, match=r"spec\.ps\.replicas"):
        asyncio.run(_reconcile(body, memo))
    assert kube.objects == {}
    assert body["status"]["phase"] == "Failed"
    (cond,) = body["status"]["conditions"]
    assert cond["reason"] == "InvalidSpec"
    assert cond["message"].startswith("spec.ps.replicas: must be >= 1")
    # The user fixes the spec: the update handler recovers.
    body["spec"]["ps"] = {"replicas": 2}
    asyncio.run(_reconcile(body, memo))
    assert body["status"]["phase"] == "Pending"
    assert body["status"]["conditions"][0]["status"] == "True"


def test_api_outages_are_temporary_and_rejections_permanent() -> None:
    body = job_body()
    kube = FakeKube(body)
    memo = Memo(runtime=_runtime(kube, Script([])))
    kube.fail_next = ApiException(status=503, reason="Service Unavailable")
    with pytest.raises(kopf.TemporaryError) as temporary:
        asyncio.run(_reconcile(body, memo))
    assert temporary.value.delay == handlers.RETRY_DELAY
    kube.fail_next = ApiException(status=422, reason="Unprocessable Entity")
    with pytest.raises(kopf.PermanentError):
        asyncio.run(_reconcile(body, memo))


def test_a_finished_job_does_not_get_its_pods_back_on_resume() -> None:
    body = job_body()
    body["status"] = {"phase": "Succeeded", "message": "endDay reached"}
    kube = FakeKube(body)
    asyncio.run(_reconcile(body, Memo(runtime=_runtime(kube, Script([])))))
    assert "StatefulSet" not in {kind for kind, _ in kube.objects}
    assert ("ConfigMap", "ctr-online-config") in kube.objects
    assert body["status"]["phase"] == "Succeeded"


def test_a_suspended_job_is_created_at_zero() -> None:
    body = job_body(suspend=True)
    kube = FakeKube(body)
    asyncio.run(_reconcile(body, Memo(runtime=_runtime(kube, Script([])))))
    assert kube.replicas("ps") == 0 and kube.replicas("worker") == 0


# ------------------------------------------------------------------------------ daemon


def test_daemon_trains_to_the_end_then_removes_pods_and_keeps_models() -> None:
    body = job_body()
    kube = FakeKube(body)
    script = Script(
        [
            (
                [
                    _training("20261101", 1),
                    replace(
                        _training("20261101", 2, auc=0.8),
                        phase=Phase.SUCCEEDED,
                        message="endDay reached",
                    ),
                ],
                False,
            )
        ]
    )
    conn = FakeConnection(ready_after=2)
    rt = _runtime(kube, script, conn)
    memo = Memo(runtime=rt)
    asyncio.run(handlers.run_job(body=body, memo=memo, stopped=Stop()))
    assert conn.attempts == 3 and conn.closed
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "PodsReady")
    assert ready["status"] == "True"
    assert any(p.get("conditions", [{}])[0].get("reason") == "WaitingForPods" for p in kube.patches)
    assert body["status"]["phase"] == "Succeeded"
    assert body["status"]["metrics"]["auc"] == "0.8"
    assert ("StatefulSet", "ctr-online-ps") in kube.deleted
    assert ("StatefulSet", "ctr-online-worker") in kube.deleted
    assert ("ConfigMap", "ctr-online-config") in kube.objects  # no model or config is touched
    assert kube.reasons() == ["PassCompleted", "Succeeded"]
    assert (
        metric(rt, "streamtrain_job_passes_completed_total", namespace="ads", job="ctr-online") == 1
    )
    assert metric(rt, "streamtrain_job_auc", namespace="ads", job="ctr-online") == 0.8
    assert (
        metric(rt, "streamtrain_job_phase", namespace="ads", job="ctr-online", phase="Succeeded")
        == 1
    )
    assert memo.supervisor is None


def test_suspend_stops_after_the_step_scales_to_zero_and_resume_restarts() -> None:
    async def scenario() -> tuple[FakeKube, Script, Runtime]:
        body = job_body()
        kube = FakeKube(body)
        script = Script(
            [([_training("20261101", 1)], True), ([_training("20261101", 2, generation=2)], True)]
        )
        rt = _runtime(kube, script)
        memo = Memo(runtime=rt)
        stop = Stop()
        daemon = asyncio.create_task(handlers.run_job(body=body, memo=memo, stopped=stop))
        await _until(lambda: len(script.drivers) == 1 and body["status"].get("phase") == "Training")
        assert kube.replicas("worker") == 4
        body["spec"]["suspend"] = True
        body["metadata"]["generation"] = 2
        await _reconcile(body, memo)  # the update handler: stop after the current step
        await _until(lambda: body["status"].get("phase") == "Suspended")
        assert kube.replicas("ps") == 0 and kube.replicas("worker") == 0
        assert body["status"]["lastCompleted"]["pass"] == 1  # the pass in flight finished
        body["spec"]["suspend"] = False
        body["spec"]["workers"]["replicas"] = 6
        await _reconcile(body, memo)
        await _until(lambda: len(script.drivers) == 2 and body["status"].get("generation") == 2)
        assert kube.replicas("worker") == 6 and script.drivers[1].spec.workers.replicas == 6
        stop.event.set()
        await daemon
        return kube, script, rt

    kube, script, _ = asyncio.run(scenario())
    assert "Suspended" in kube.reasons()
    assert script.drivers[0].stop_phase == Phase.STOPPED  # stopped at a step boundary
    assert script.drivers[1].cancelled  # the daemon's stop cancels the resumed driver


def test_a_worker_count_change_waits_for_the_next_step() -> None:
    async def scenario() -> None:
        body = job_body()
        kube = FakeKube(body)
        script = Script([([_training("20261101", 1)], True), ([_training("20261101", 2)], True)])
        memo = Memo(runtime=_runtime(kube, script))
        stop = Stop()
        daemon = asyncio.create_task(handlers.run_job(body=body, memo=memo, stopped=stop))
        await _until(lambda: len(script.drivers) == 1)
        body["spec"]["workers"]["replicas"] = 2
        await _reconcile(body, memo)
        # The handler kept the running scale; the driver was asked to stop after its step.
        assert script.drivers[0].stopped.is_set()
        await _until(lambda: len(script.drivers) == 2)
        assert kube.replicas("worker") == 2
        assert script.drivers[1].spec.workers.replicas == 2
        stop.event.set()
        await daemon

    asyncio.run(scenario())


def test_a_spec_change_ends_a_wait_for_pods_that_never_come() -> None:
    async def scenario() -> FakeKube:
        body = job_body()
        kube = FakeKube(body)
        conn = FakeConnection(ready_after=10**9)  # e.g. an image that cannot be pulled
        memo = Memo(runtime=_runtime(kube, Script([]), conn))
        stop = Stop()
        daemon = asyncio.create_task(handlers.run_job(body=body, memo=memo, stopped=stop))
        await _until(lambda: conn.attempts >= 2)
        body["spec"]["suspend"] = True
        await _reconcile(body, memo)
        await _until(lambda: body["status"].get("phase") == "Suspended")
        assert kube.replicas("ps") == 0 and kube.replicas("worker") == 0
        stop.event.set()
        await daemon
        return kube

    kube = asyncio.run(scenario())
    waiting = [p for p in kube.patches if "conditions" in p and len(p) == 1]
    assert waiting and waiting[0]["conditions"][0]["reason"] == "WaitingForPods"


def test_a_ps_restart_cancels_the_driver_and_recovers() -> None:
    async def scenario() -> tuple[FakeKube, Script, Runtime]:
        body = job_body()
        kube = FakeKube(body)
        kube.pod_states["ps"] = {"ctr-online-ps-0": ("a", 0), "ctr-online-ps-1": ("b", 0)}
        kube.pod_states["worker"] = {"ctr-online-worker-0": ("c", 0)}
        script = Script(
            [([_training("20261101", 1)], True), ([_training("20261101", 1, generation=2)], True)]
        )
        rt = _runtime(kube, script)
        memo = Memo(runtime=rt)
        stop = Stop()
        daemon = asyncio.create_task(handlers.run_job(body=body, memo=memo, stopped=stop))
        await _until(lambda: len(script.drivers) == 1)
        kube.pod_states["worker"] = {"ctr-online-worker-0": ("c", 1)}
        await _until(lambda: "WorkerRestarted" in kube.reasons())
        kube.pod_states["ps"] = {"ctr-online-ps-0": ("a", 0), "ctr-online-ps-1": ("b2", 0)}
        await _until(lambda: len(script.drivers) == 2)
        stop.event.set()
        await daemon
        return kube, script, rt

    kube, script, rt = asyncio.run(scenario())
    assert script.drivers[0].cancelled
    assert "Recovering" in kube.reasons()
    labels = {"namespace": "ads", "job": "ctr-online"}
    assert metric(rt, "streamtrain_job_restarts_total", role="ps", **labels) == 1
    assert metric(rt, "streamtrain_job_restarts_total", role="worker", **labels) == 1


def test_a_stopped_daemon_cancels_the_driver_promptly() -> None:
    async def scenario() -> Script:
        body = job_body()
        kube = FakeKube(body)
        script = Script([([_training("20261101", 1)], True)])
        memo = Memo(runtime=_runtime(kube, script))
        stop = Stop()
        daemon = asyncio.create_task(handlers.run_job(body=body, memo=memo, stopped=stop))
        await _until(lambda: len(script.drivers) == 1)
        stop.event.set()
        await asyncio.wait_for(daemon, 5)
        return script

    assert asyncio.run(scenario()).drivers[0].cancelled


def test_deletion_forgets_the_jobs_series() -> None:
    body = job_body()
    kube = FakeKube(body)
    rt = _runtime(kube, Script([]))
    rt.metrics.set_phase("ads", "ctr-online", "Training")
    rt.metrics.pass_completed(
        "ads", "ctr-online", duration_seconds=1, wait_seconds=0, metrics={"auc": 0.7}
    )
    rt.metrics.restarted("ads", "ctr-online", "ps")
    asyncio.run(handlers.forget(meta=body["metadata"], memo=Memo(runtime=rt)))
    names = {
        s.name
        for m in rt.metrics.registry.collect()
        for s in m.samples
        if s.labels.get("job") == "ctr-online"
    }
    assert names == set()


async def _until(condition: Any, timeout: float = 30.0) -> None:
    """Poll (never sleep blindly) until ``condition()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)
