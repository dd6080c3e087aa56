"""The life of one job on Kubernetes, around the scheduler's driver (one kopf daemon each).

The driver (``driver.py``) runs passes; this module decides *when* it runs and against
what: it applies the job's children at the scale the scheduler is allowed to use, waits for
the pods' gRPC health, runs the driver with progress stored in the job's status, and reacts:

- ``spec.suspend``: the driver stops after the current step, the StatefulSets scale to
  zero, the phase is Suspended; resuming restarts the driver, which reloads the last
  checkpoint and replays the steps after it (the scheduler's restart semantics);
- a spec change (e.g. ``workers.replicas``): the driver stops after the current step (the
  pass in flight finishes with the old workers), children are re-applied, a new driver
  continues with the next step — so the change takes effect at the next pass;
- a PS pod restarted or recreated (its memory is gone): the driver is cancelled and
  restarted, which bumps the generation, reloads every shard from the last checkpoint
  and replays; a worker restart is only counted and reported (a worker that died during a
  pass failed its share, and the driver restores for that: ``Scheduler._on_share_failed``);
- Succeeded (``endDay`` reached): the StatefulSets are deleted — pods removed, the models
  in object storage untouched; Failed: the pods scale to zero, the status says why.

Only the holder of the job's Lease drives it (``lease.py``): a cycle first takes the Lease
(another operator holds it: wait and look again), renews it beside the driver, and every
status write checks it is still held, so a second operator pod never drives a job the
first one holds, and one that lost its Lease writes nothing more.

Every wait polls with a timeout and ends promptly when kopf signals the daemon to stop.
Events are posted at pass start and end, exports, shrinks, recoveries and phase changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from streamtrain_operator.job import render
from streamtrain_operator.job.messages import Action, RunPass
from streamtrain_operator.job.plan import EXPORT_KINDS, StepKind
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import Job, JobSpec, SpecError
from streamtrain_operator.kube import resources
from streamtrain_operator.kube import status as st
from streamtrain_operator.kube.api import KubeAPI
from streamtrain_operator.kube.desired import desired, read_job
from streamtrain_operator.kube.lease import DriverLease, LeaseLost
from streamtrain_operator.kube.metrics import OperatorMetrics
from streamtrain_operator.run.connection import Connection, dial
from streamtrain_operator.run.driver import Driver, Observer
from streamtrain_operator.run.hooks import NO_HOOK, StepHook
from streamtrain_operator.run.state import StateStore
from streamtrain_ps.plumbing.tls import TLSFiles

log = logging.getLogger(__name__)


Connector = Callable[[Job, resources.Scale, resources.Options], Connection]
DriverFactory = Callable[..., Driver]


class StopSignal(Protocol):
    """kopf's ``stopped`` flag of a daemon (``DaemonStopped``)."""

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


@dataclass(frozen=True)
class GrpcConnector:
    """Dials the pods' stable DNS names; ``endpoint_map`` rewrites ``host:port`` (an
    operator running outside the cluster through port-forwards, or the local-process
    contract test)."""

    endpoint_map: Mapping[str, str] = field(default_factory=dict)
    #: The operator's certificate (``None``: plaintext).
    tls: TLSFiles | None = None

    def __call__(self, job: Job, scale: resources.Scale, options: resources.Options) -> Connection:
        def rewrite(endpoint: str) -> str:
            return self.endpoint_map.get(endpoint, endpoint)

        return dial(
            [rewrite(e) for e in resources.ps_addresses(job, scale.ps, options)],
            [rewrite(e) for e in resources.worker_addresses(job, scale.workers, options)],
            render.ps_config(job.spec),
            worker_name=f"{job.name}-worker",
            tls=self.tls,
        )


@dataclass
class Runtime:
    """Everything a job's handlers need, built once in ``main`` (no globals)."""

    kube: KubeAPI
    metrics: OperatorMetrics
    options: resources.Options = field(default_factory=resources.Options)
    connector: Connector = field(default_factory=GrpcConnector)
    driver_factory: DriverFactory = Driver
    clock: Callable[[], float] = time.time
    #: One attempt of waiting for the pods' health (then the status is refreshed).
    ready_timeout: float = 10.0
    #: How often PS/worker pods are checked for restarts.
    restart_poll_seconds: float = 15.0
    #: How often a suspended or invalid job re-reads its (live) spec.
    idle_poll_seconds: float = 5.0
    #: Given to every driver (``run.hooks``): the fault tests hold a run at a step with it.
    step_hook: StepHook = NO_HOOK
    #: This operator's name in the jobs' Leases (the pod name, ``main``). ``None``: no
    #: Lease — only for tests that drive a supervisor over a fake API without Leases.
    identity: str | None = None


class PodRestarts:
    """The driver's ``RestartWatch`` on Kubernetes: notices restarted pods (the kubelet
    restarts them; there is nothing to heal).

    A pod whose uid or container restart count changed lost its process's memory. The
    driver asks after every step (``heal``), as ``LocalCluster`` does in local mode, so a
    PS restart voids the step it happened in and nothing later runs — or publishes a model
    — against the emptied shard; the supervisor's watch asks every
    ``restart_poll_seconds`` to catch a restart during a long step. One baseline serves
    both: whoever sees a restart first consumes it, so it is restored once and reported
    once (``report``: role and pod names). ``ready`` waits until every pod answers: after a
    restart the driver's restore talks to the restarted pod at once (``LocalCluster.heal``
    waits for its children the same way), and a container that was just started may not
    serve yet.
    """

    def __init__(
        self,
        list_pods: Callable[[str], Mapping[str, tuple[str, int]]],
        report: Callable[[str, Sequence[str]], None],
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._list = list_pods
        self._report = report
        self._ready = ready
        self._seen: dict[str, dict[str, tuple[str, int]]] = {}
        self.ps_restarts = 0
        self.last_ps_restart = ""
        self.worker_restarts = 0
        self.last_worker_restart = ""

    async def poll(self) -> tuple[list[str], list[str]]:
        """The PS and the worker pods restarted since the previous poll (the first poll
        sets the baseline)."""
        now = {role: dict(await asyncio.to_thread(self._list, role)) for role in resources.ROLES}
        changed: dict[str, list[str]] = {}
        for role, pods in now.items():
            seen = self._seen.get(role)
            changed[role] = (
                [] if seen is None else sorted(n for n, s in pods.items() if seen.get(n, s) != s)
            )
            self._seen[role] = pods
        if changed["ps"]:
            self.ps_restarts += len(changed["ps"])
            self.last_ps_restart = f"PS {', '.join(changed['ps'])} restarted"
        if changed["worker"]:
            self.worker_restarts += len(changed["worker"])
            self.last_worker_restart = f"{', '.join(changed['worker'])} restarted"
        for role, names in changed.items():
            if names:
                self._report(role, names)
        return changed["ps"], changed["worker"]

    async def heal(self) -> list[str]:
        try:
            ps, workers = await self.poll()
        except Exception:  # a failed listing is not a restart; the next check sees it
            log.warning("listing the job's pods failed", exc_info=True)
            return []
        if (ps or workers) and self._ready is not None:
            try:
                await self._ready()
            except Exception:  # not yet: the restore's own retries take it from here
                log.warning("restarted pods do not answer yet", exc_info=True)
        return [f"{name} restarted" for name in ps + workers]


class JobSupervisor:
    """Runs one job until it ends or kopf stops the daemon. ``body`` is kopf's live view
    of the object (it changes as the object changes)."""

    def __init__(self, rt: Runtime, body: Mapping[str, Any]) -> None:
        self.rt = rt
        self.body = body
        self.driver: Driver | None = None
        self.scale: resources.Scale | None = None
        #: The spec of the current cycle: the update/resume handler asks for a restart
        #: only when the spec differs (kopf's resume handler runs at every operator start).
        self.spec: JobSpec | None = None
        self._previous: Progress | None = None
        #: Set by the update handler; read at every waiting point of a cycle.
        self._restart = False
        meta = body["metadata"]
        self.lease: DriverLease | None = (
            None
            if rt.identity is None
            else DriverLease(
                cast(Any, rt.kube),
                meta.get("namespace", "default"),
                meta["name"],
                rt.identity,
                rt.clock,
            )
        )
        self._waiting_for_lease = False

    # ------------------------------------------------------------------ identity

    @property
    def ref(self) -> dict[str, str]:
        meta = self.body["metadata"]
        return {
            "namespace": meta.get("namespace", "default"),
            "name": meta["name"],
            "uid": meta.get("uid", ""),
        }

    def _status(self) -> MutableMapping[str, Any]:
        return dict(self.body.get("status") or {})

    def _patch(self, body: Mapping[str, Any]) -> None:
        """Every status write of the supervisor and its driver: only while the Lease is
        held (``LeaseLost`` otherwise, before anything is sent)."""
        if self.lease is not None:
            self.lease.check()
        self.rt.kube.patch_status(self.ref["namespace"], self.ref["name"], body)

    def _event(self, reason: str, message: str, warning: bool = False) -> None:
        """Events are best effort: an unreachable API never fails a pass for one."""
        try:
            self.rt.kube.event(self.ref, "Warning" if warning else "Normal", reason, message)
        except Exception:
            log.warning("event %s of %s not posted", reason, self.ref["name"], exc_info=True)

    # ------------------------------------------------------------------ control

    def request_restart(self, reason: str) -> None:
        """Called by the update handler: stop after the current step, then re-read the
        spec (suspend, new worker count, new images...). Also ends a wait for pods that
        may never come (a bad image is fixed by a spec change)."""
        self._restart = True
        if self.driver is not None:
            self.driver.stop(Phase.STOPPED, reason)

    async def run(self, stopped: StopSignal) -> None:
        try:
            while not stopped.is_set():
                if not await self._hold_lease():
                    await self._idle(stopped)
                    continue
                try:
                    if await self._cycle(stopped):
                        return
                except LeaseLost as exc:  # another operator drives the job now
                    log.warning("%s: %s; not driving it", self.ref["name"], exc)
        finally:
            self.driver = None
            if self.lease is not None:
                await asyncio.to_thread(self.lease.release)

    async def _hold_lease(self) -> bool:
        """Take (or keep) the job's Lease; ``False`` while another operator holds it."""
        if self.lease is None:
            return True
        try:
            held = await asyncio.to_thread(self.lease.acquire)
        except Exception:  # the API is away: not held, look again after the idle poll
            log.warning("lease of %s not acquired", self.ref["name"], exc_info=True)
            held = False
        if not held and not self._waiting_for_lease:
            log.info("%s is driven by another operator: waiting for its Lease", self.ref["name"])
        self._waiting_for_lease = not held
        return held

    async def _keep_lease(self) -> None:
        """Renew the Lease beside the driver; return once it is lost (the driver stops)."""
        assert self.lease is not None
        while True:
            await asyncio.sleep(self.lease.duration / 3)
            try:
                await asyncio.to_thread(self.lease.renew)
            except LeaseLost as exc:
                log.warning("%s: %s", self.ref["name"], exc)
                return
            except Exception:  # a failed renewal: retried; ``check`` fences the writes
                log.warning("lease of %s not renewed", self.ref["name"], exc_info=True)

    async def _cycle(self, stopped: StopSignal) -> bool:
        """One look at the job; ``True`` when the daemon is done for good."""
        try:
            job = read_job(self.body, self.rt.options)
        except SpecError:
            await self._idle(stopped)  # the create/update handler reported it
            return False
        progress = st.progress_from_status(self._status())
        if progress is not None and progress.phase in Phase.TERMINAL:
            await asyncio.to_thread(self._finish, job, progress)
            return True
        if job.spec.suspend:
            await asyncio.to_thread(self._suspend, job, progress)
            await self._idle(stopped)
            return False
        return await self._run_driver(job, progress, stopped)

    async def _idle(self, stopped: StopSignal) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), self.rt.idle_poll_seconds)

    # ------------------------------------------------------------------ phases

    def _apply(self, job: Job, scale: resources.Scale, generation: int) -> None:
        for obj in desired(job, self.ref["uid"], scale, generation, self.rt.options):
            self.rt.kube.apply(obj)
        self.scale = scale

    def _scale_to_zero(self, job: Job) -> None:
        for role in resources.ROLES:
            with contextlib.suppress(Exception):  # already gone is fine
                self.rt.kube.scale(job.namespace, resources.statefulset_name(job, role), 0)
        self.scale = resources.Scale(0, 0)

    def _suspend(self, job: Job, progress: Progress | None) -> None:
        if self._status().get("phase") == Phase.SUSPENDED and self.scale == resources.Scale(0, 0):
            return
        generation = 0 if progress is None else progress.generation
        self._apply(job, resources.Scale(0, 0), generation)
        self._patch(
            st.phase_patch(Phase.SUSPENDED, "spec.suspend is true", self.rt.clock(), self._status())
        )
        self.rt.metrics.set_phase(job.namespace, job.name, Phase.SUSPENDED)
        self._event("Suspended", "scaled to zero; resuming reloads the last checkpoint")

    def _finish(self, job: Job, progress: Progress) -> None:
        """Succeeded: delete the pods' StatefulSets, keep the models. Failed: scale to 0."""
        self.rt.metrics.set_phase(job.namespace, job.name, progress.phase)
        if progress.phase == Phase.SUCCEEDED:
            removed = [
                name
                for role in resources.ROLES
                if self.rt.kube.delete(
                    "StatefulSet", job.namespace, name := resources.statefulset_name(job, role)
                )
            ]
            if removed:
                self._event("Succeeded", f"{progress.message}; pods removed, models kept")
        else:
            self._scale_to_zero(job)
            self._event("Failed", progress.message or "the job failed", warning=True)

    async def _run_driver(self, job: Job, progress: Progress | None, stopped: StopSignal) -> bool:
        self._restart = False
        self.spec = job.spec
        scale = resources.Scale(job.spec.ps.replicas, job.spec.workers.replicas)
        generation = 1 + (0 if progress is None else progress.generation)
        await asyncio.to_thread(self._apply, job, scale, generation)
        conn = self.rt.connector(job, scale, self.rt.options)
        tasks: list[asyncio.Future[Any]] = []
        try:
            if not await self._wait_ready(conn, job, stopped):
                return False
            store = st.StatusStore(
                self._patch,
                self._status(),
                self.rt.clock,
                observed_generation=self.body["metadata"].get("generation"),
            )
            # Restarts count from the moment every pod answered.
            restarts = PodRestarts(
                lambda role: self._pods(job, role),
                lambda role, names: self._restarted(job, role, names),
                lambda: conn.wait_ready(self.rt.ready_timeout),
            )
            await restarts.poll()
            self.driver = self._make_driver(job, conn, store, restarts)
            if self._restart:  # the spec changed while the pods came up
                self.driver.stop(Phase.STOPPED, "spec changed")
            # Each task joins ``tasks`` as it is made, so the ``finally`` cancels it whatever
            # fails next. kopf's ``stopped.wait()`` is an awaitable (``AsyncFlagPromise``),
            # not a coroutine: ``ensure_future`` takes it, ``create_task`` would raise and
            # leave the driver running on closed channels.
            run = asyncio.create_task(self.driver.run())
            tasks.append(run)
            watch = asyncio.create_task(self._watch_ps(job, restarts))
            tasks.append(watch)
            keep = asyncio.create_task(
                self._keep_lease() if self.lease is not None else asyncio.Event().wait()
            )
            tasks.append(keep)
            stop = asyncio.ensure_future(stopped.wait())
            tasks.append(stop)
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                return await self._after_run(job, run.result())
            if watch.done() or keep.done():  # a PS restarted during a step, or the Lease
                # is lost: the step's outcome is void (a lost Lease: nothing more is recorded)
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
            return False
        finally:
            self.driver = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await conn.close()

    def _make_driver(
        self, job: Job, conn: Connection, store: StateStore, restarts: PodRestarts
    ) -> Driver:
        return self.rt.driver_factory(
            job.spec,
            conn.ps,
            conn.workers,
            store,
            clock=self.rt.clock,
            observer=Observer(on_action=self._on_action, on_progress=self._on_progress),
            restarts=restarts,
            step_hook=self.rt.step_hook,
        )

    async def _after_run(self, job: Job, progress: Progress) -> bool:
        if progress.phase in Phase.TERMINAL:
            await asyncio.to_thread(self._finish, job, progress)
            return True
        return False  # Stopped for a spec change or suspend: the next cycle decides

    async def _wait_ready(self, conn: Connection, job: Job, stopped: StopSignal) -> bool:
        waiting = False
        while not stopped.is_set() and not self._restart:
            try:
                await self._unless_stopped(conn.wait_ready(self.rt.ready_timeout), stopped)
            except Exception as exc:  # not ready yet: say so in the status, keep waiting
                if not waiting:
                    message = f"waiting for {self.scale} pods of {job.name}: {exc}"
                    patch = st.pods_ready(False, "WaitingForPods", message, self.rt.clock(), {})
                    await asyncio.to_thread(self._merge_conditions, patch)
                    waiting = True
                continue
            if stopped.is_set():  # stopped while waiting: the pods did not answer
                return False
            patch = st.pods_ready(
                True, "AllReady", "every PS shard and worker answers", self.rt.clock(), {}
            )
            await asyncio.to_thread(self._merge_conditions, patch)
            return True
        return False

    @staticmethod
    async def _unless_stopped(work: Awaitable[None], stopped: StopSignal) -> None:
        """Await ``work``, but give up as soon as kopf stops the daemon (deletion)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            await asyncio.gather(task, stop, return_exceptions=True)
        if stopped.is_set():
            return
        task.result()

    def _merge_conditions(self, patch: Mapping[str, Any]) -> None:
        status = self._status()
        conditions: Sequence[Mapping[str, Any]] = status.get("conditions", ())
        for cond in patch["conditions"]:
            conditions = st.set_condition(conditions, cond)
        self._patch({"conditions": list(conditions)})

    # ------------------------------------------------------------------ restarts

    def _pods(self, job: Job, role: str) -> dict[str, tuple[str, int]]:
        return self.rt.kube.pods(job.namespace, resources.selector_labels(job, role))

    async def _watch_ps(self, job: Job, restarts: PodRestarts) -> list[str]:
        """Return the PS pods that restarted (or were recreated) during a step: the driver
        checks after every step itself, this catches a restart while a long step runs."""
        while True:
            await asyncio.sleep(self.rt.restart_poll_seconds)
            try:
                ps, _ = await restarts.poll()
            except Exception:  # a failed poll is not a restart: the driver keeps running
                log.warning("listing the pods of %s failed", job.name, exc_info=True)
                continue
            if ps:
                return ps

    def _restarted(self, job: Job, role: str, names: Sequence[str]) -> None:
        self.rt.metrics.restarted(job.namespace, job.name, role, len(names))
        if role == "ps":
            self._event(
                "Recovering",
                f"PS {', '.join(names)} restarted: reloading every shard from the last "
                "checkpoint and replaying (new generation)",
                warning=True,
            )
        else:
            self._event("WorkerRestarted", f"{', '.join(names)}: restarted")

    # ------------------------------------------------------------------ observer

    def _on_action(self, action: Action, progress: Progress) -> None:
        if isinstance(action, RunPass) and not action.replay and action.attempt == 1:
            key = action.key
            self._event(
                "PassStarted",
                f"day {key.day} pass {key.pass_index} on {len(action.shares)} worker(s), "
                f"generation {action.generation}",
            )

    def _on_progress(self, progress: Progress) -> None:
        prev, self._previous = self._previous, progress
        ns, name = self.ref["namespace"], self.ref["name"]
        self.rt.metrics.observe(ns, name, prev, progress)
        done = progress.completed
        if done is None or (prev is not None and prev.completed == done) or prev is None:
            return
        where = f"day {done.day} pass {done.pass_index}"
        if done.kind == StepKind.TRAIN and progress.last_pass is not None:
            m = progress.last_pass.metrics
            shown = ", ".join(f"{k} {m[k]:.4g}" for k in ("auc", "loss", "copc") if k in m)
            self._event("PassCompleted", f"{where}: {shown or 'empty pass: no examples'}")
        elif done.kind in EXPORT_KINDS:
            uri = progress.export.uri if progress.export else ""
            self._event("Exported", f"{done.kind.value} model of {where} published at {uri}")
        elif done.kind == StepKind.SHRINK:
            self._event("Shrunk", f"end of day {done.day}: decayed and evicted")
