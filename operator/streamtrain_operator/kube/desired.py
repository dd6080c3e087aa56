"""What a job's children should be, built by pure functions from the parsed job.

The handlers and the daemon both need to read a custom resource into a :class:`Job` and to
build the objects it wants (``resources.build`` with the rendered component configs); those
functions live here, apart from the daemon that applies them, so a handler never reaches
into the daemon module for pure helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamtrain_operator.job import render
from streamtrain_operator.job.progress import Phase
from streamtrain_operator.job.spec import Job, parse_job
from streamtrain_operator.kube import resources


def manifest(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a kopf body ``parse_job`` reads, as plain data."""
    meta = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace", "default")},
        "spec": _plain(body.get("spec")),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def read_job(body: Mapping[str, Any], options: resources.Options) -> Job:
    """Parse and check a job against the operator's settings (raises :class:`SpecError`
    naming the field)."""
    job = parse_job(manifest(body))
    resources.check_name(job)
    resources.check_images(job, options)
    return job


def configs(job: Job, options: resources.Options) -> dict[str, str]:
    """The rendered component configs of the ConfigMap (workers dial the PS DNS names)."""
    ps = resources.ps_addresses(job, job.spec.ps.replicas, options)
    return {
        resources.PS_CONFIG_FILE: render.render_ps(job.spec),
        resources.WORKER_CONFIG_FILE: render.render_worker(job.spec, ps),
    }


def desired(
    job: Job, uid: str, scale: resources.Scale, generation: int, options: resources.Options
) -> list[dict[str, Any]]:
    job = resources.with_defaults(job, options)
    return resources.build(
        job,
        configs=configs(job, options),
        scale=scale,
        generation=generation,
        owner=resources.Owner(name=job.name, uid=uid),
        options=options,
    )


def initial_scale(job: Job, status: Mapping[str, Any]) -> resources.Scale:
    """Pods a job should have before its daemon decides: none when suspended or done."""
    done = status.get("phase") in Phase.TERMINAL
    if job.spec.suspend or done:
        return resources.Scale(0, 0)
    return resources.Scale(job.spec.ps.replicas, job.spec.workers.replicas)
