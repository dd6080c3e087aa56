"""kopf handlers, thin on purpose: parse, build, apply, report status.

Plain async functions (``main.py`` registers them with kopf), so tests call them directly
with a fake kube layer. Everything they need comes through ``memo.runtime``
(:class:`~streamtrain_operator.kube.daemon.Runtime`, built in ``main``).

- :func:`reconcile` (create, resume, spec update): parse the spec — a bad spec becomes a
  ``SpecValid=False`` condition naming the field *and* a ``kopf.PermanentError`` (retrying
  cannot fix it; the next edit re-runs the handler) — then apply the job's children and
  tell a running supervisor to pick the new spec up at the next step boundary.
- :func:`run_job` (one daemon per job): the job's supervisor; kopf stops it on deletion.
- :func:`forget` (deletion): drop the job's metric series; children go with their owner.

Errors are classified by what kopf should do: API conflicts, throttling, server errors and
connection failures are ``TemporaryError(delay=...)``; a rejected object is permanent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from streamtrain_operator.job.progress import Phase
from streamtrain_operator.job.spec import SpecError
from streamtrain_operator.kube import status as st
from streamtrain_operator.kube.daemon import JobSupervisor, Runtime, StopSignal
from streamtrain_operator.kube.desired import desired, initial_scale, read_job

#: Seconds before kopf retries after a temporary API failure.
RETRY_DELAY = 10.0
_T = TypeVar("_T")


async def _api(fn: Callable[..., _T], *args: Any) -> _T:
    """Run one blocking kube call off the event loop; classify its failure for kopf."""
    try:
        return await asyncio.to_thread(fn, *args)
    except ApiException as exc:
        if exc.status in (409, 429) or (exc.status or 0) >= 500:
            raise kopf.TemporaryError(
                f"API {exc.status} {exc.reason}: retrying", delay=RETRY_DELAY
            ) from exc
        raise kopf.PermanentError(f"API {exc.status} {exc.reason}: {exc.body}") from exc
    except HTTPError as exc:
        raise kopf.TemporaryError(f"API unreachable: {exc}", delay=RETRY_DELAY) from exc


async def reconcile(
    body: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    memo: Any,
    **_: Any,
) -> None:
    rt: Runtime = memo.runtime
    namespace, name = meta.get("namespace", "default"), meta["name"]
    existing = dict(status or {})
    generation = meta.get("generation")
    try:
        job = read_job(body, rt.options)
    except SpecError as exc:
        message = str(exc).removeprefix(f"{exc.path}: ")
        patch = st.invalid_spec(message, exc.path, rt.clock(), generation, existing)
        await _api(rt.kube.patch_status, namespace, name, patch)
        rt.metrics.set_phase(namespace, name, Phase.FAILED)
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    await _api(
        rt.kube.patch_status, namespace, name, st.valid_spec(rt.clock(), generation, existing)
    )
    supervisor: JobSupervisor | None = memo.get("supervisor")
    scale = initial_scale(job, existing)
    progress = st.progress_from_status(existing)
    labels_generation = 0 if progress is None else progress.generation
    # A job that reached endDay has had its pods removed: do not bring the StatefulSets back.
    # While a supervisor runs, it owns the StatefulSets (a new worker count waits for the
    # next pass): the restart requested below re-applies them at its next cycle. Applying
    # them here too raced with that cycle — e.g. on resume from suspend, this handler's
    # zero replicas could land after the supervisor's scale-up.
    skip_pods = existing.get("phase") == Phase.SUCCEEDED or supervisor is not None
    for obj in desired(job, meta.get("uid", ""), scale, labels_generation, rt.options):
        if not (skip_pods and obj["kind"] == "StatefulSet"):
            await _api(rt.kube.apply, obj)
    # kopf also runs this handler when the operator starts (resume): a supervisor already
    # running this very spec must not be restarted — that cost a reload and replay, and a
    # generation, at every operator start.
    if supervisor is not None and supervisor.spec != job.spec:
        supervisor.request_restart(f"spec generation {generation} applied")


async def run_job(body: Mapping[str, Any], memo: Any, stopped: Any, **_: Any) -> None:
    """``stopped`` is kopf's daemon flag (a :class:`StopSignal`)."""
    rt: Runtime = memo.runtime
    supervisor = JobSupervisor(rt, body)
    memo.supervisor = supervisor
    signal: StopSignal = stopped
    try:
        await supervisor.run(signal)
    finally:
        memo.supervisor = None


async def forget(meta: Mapping[str, Any], memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    rt.metrics.forget(meta.get("namespace", "default"), meta["name"])
