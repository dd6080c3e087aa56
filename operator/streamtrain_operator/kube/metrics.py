"""The operator's Prometheus metrics: job-level series, one registry injected by ``main``.

PS shards and workers export their own series (keys, memory, RPC latency, examples); the
operator adds what only the control plane knows (docs/design.md §5): the phase of every
job, passes completed, pass duration and donefile wait, the last *global* AUC, loss and
COPC (from summed histograms, never a mean of per-worker values), restarts by role and
published models. Labels are ``namespace``, ``job`` and ``role`` (plus the bounded
``phase`` of the state-set gauge) — never pass ids or days, whose cardinality grows
forever. When a job is deleted, :meth:`OperatorMetrics.forget` removes its series.

The quality gauges (AUC, loss, COPC) hold the value of the last pass that *defined* it. A
pass without examples defines none of them and a pass of one class no AUC; such a pass
counts as completed (``streamtrain_job_passes_completed_total``) and adds nothing to
``streamtrain_job_examples_total`` — that pair is how an empty pass shows — but leaves
the gauges alone. Not updating beats the alternatives: a placeholder (AUC 0.5) is a fake
quality drop that pages on a quiet night; NaN breaks every comparison and graph; removing
the series opens gaps that ``absent()`` and ``max_over_time`` windows misread. An empty
pass trained nothing, so the last measured value still describes the model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamtrain_operator.job.plan import EXPORT_KINDS, StepKind
from streamtrain_operator.job.progress import Progress

JOB = ("namespace", "job")
#: Pass durations: minutes to a couple of hours.
PASS_BUCKETS = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400)
#: Donefile waits: none at all (data was there) up to a day.
WAIT_BUCKETS = (0, 1, 10, 60, 300, 900, 1800, 3600, 7200, 21600, 86400)
ROLES = ("ps", "worker")


class OperatorMetrics:
    """Every operator series; methods take the job's identity, never a pass id."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.phase = Gauge(
            "streamtrain_job_phase",
            "1 for the job's current phase (a state set: sum by (phase) counts jobs).",
            [*JOB, "phase"],
            registry=registry,
        )
        self.passes = Counter(
            "streamtrain_job_passes_completed",
            "Passes whose results are in (all workers returned).",
            JOB,
            registry=registry,
        )
        self.examples = Counter(
            "streamtrain_job_examples",
            "Examples trained, summed over workers (rate() gives examples/s).",
            JOB,
            registry=registry,
        )
        self.pass_duration = Histogram(
            "streamtrain_job_pass_duration_seconds",
            "Wall time of a pass from dispatch to the barrier (excludes donefile wait).",
            JOB,
            buckets=PASS_BUCKETS,
            registry=registry,
        )
        self.donefile_wait = Histogram(
            "streamtrain_job_donefile_wait_seconds",
            "Time a pass waited for the donefiles of its folders.",
            JOB,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.auc = Gauge(
            "streamtrain_job_auc",
            "Global AUC of the last completed pass that had both classes.",
            JOB,
            registry=registry,
        )
        self.loss = Gauge(
            "streamtrain_job_loss",
            "Global mean log loss of the last completed pass with examples.",
            JOB,
            registry=registry,
        )
        self.copc = Gauge(
            "streamtrain_job_copc",
            "Clicks over predicted clicks of the last pass that predicted any (1 is calibrated).",
            JOB,
            registry=registry,
        )
        self.skipped_files = Counter(
            "streamtrain_job_skipped_files",
            "Names in a pass's folders that were not trained as data: sub-folders, hidden "
            "(.x), marker and temporary (_x, *.tmp, *.crc, ...) files; the donefile is not "
            "counted.",
            JOB,
            registry=registry,
        )
        self.restarts = Counter(
            "streamtrain_job_restarts",
            "Component restarts noticed by the operator (a PS restart triggers recovery).",
            [*JOB, "role"],
            registry=registry,
        )
        self.exports = Counter(
            "streamtrain_job_exports",
            "Inference models published (delta, base and batch).",
            JOB,
            registry=registry,
        )
        self.checkpoints = Counter(
            "streamtrain_job_checkpoints",
            "Checkpoints published.",
            JOB,
            registry=registry,
        )
        self.generation = Gauge(
            "streamtrain_job_generation",
            "Restart generation of the job (bumped by every recovery).",
            JOB,
            registry=registry,
        )
        self._phases: dict[tuple[str, str], str] = {}

    def set_phase(self, namespace: str, job: str, phase: str) -> None:
        previous = self._phases.get((namespace, job))
        if previous == phase:
            return
        if previous is not None:
            self.phase.remove(namespace, job, previous)
        self.phase.labels(namespace, job, phase).set(1)
        self._phases[(namespace, job)] = phase

    def set_generation(self, namespace: str, job: str, generation: int) -> None:
        self.generation.labels(namespace, job).set(generation)

    def pass_completed(
        self,
        namespace: str,
        job: str,
        *,
        duration_seconds: float,
        wait_seconds: float,
        metrics: Mapping[str, float],
    ) -> None:
        """Record one finished pass with its global metrics (``auc``, ``loss``, ``copc``,
        ``examples``, ``skippedFiles`` when present).

        A quality metric the pass left undefined (absent, or not a finite number) leaves
        its gauge at the last defined value (module docstring).
        """
        self.passes.labels(namespace, job).inc()
        self.pass_duration.labels(namespace, job).observe(max(duration_seconds, 0.0))
        self.donefile_wait.labels(namespace, job).observe(max(wait_seconds, 0.0))
        for name, gauge in (("auc", self.auc), ("loss", self.loss), ("copc", self.copc)):
            value = metrics.get(name)
            if value is not None and math.isfinite(value):
                gauge.labels(namespace, job).set(value)
        if metrics.get("examples", 0) > 0:
            self.examples.labels(namespace, job).inc(metrics["examples"])
        if metrics.get("skippedFiles", 0) > 0:
            self.skipped_files.labels(namespace, job).inc(metrics["skippedFiles"])

    def observe(
        self, namespace: str, job: str, previous: Progress | None, progress: Progress
    ) -> None:
        """Every series a new progress record moves: phase and generation always; a step
        completed since ``previous`` (``None``: the record a run starts from, whose steps
        were counted by the run that did them) counts as a pass, export or checkpoint.
        The operator and ``streamtrain run --metrics-port`` both feed their series here."""
        self.set_phase(namespace, job, progress.phase)
        self.set_generation(namespace, job, progress.generation)
        done = progress.completed
        if done is None or previous is None or previous.completed == done:
            return
        if done.kind == StepKind.TRAIN and progress.last_pass is not None:
            m = progress.last_pass.metrics
            self.pass_completed(
                namespace,
                job,
                duration_seconds=m.get("seconds", 0.0),
                wait_seconds=progress.last_pass.wait_seconds,
                metrics=m,
            )
        elif done.kind in EXPORT_KINDS:
            self.exported(namespace, job)
        elif done.kind == StepKind.CHECKPOINT:
            self.checkpointed(namespace, job)

    def restarted(self, namespace: str, job: str, role: str, count: int = 1) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if count > 0:
            self.restarts.labels(namespace, job, role).inc(count)

    def exported(self, namespace: str, job: str) -> None:
        self.exports.labels(namespace, job).inc()

    def checkpointed(self, namespace: str, job: str) -> None:
        self.checkpoints.labels(namespace, job).inc()

    def forget(self, namespace: str, job: str) -> None:
        """Drop every series of a deleted job (else dashboards show ghosts forever)."""
        phase = self._phases.pop((namespace, job), None)
        if phase is not None:
            self.phase.remove(namespace, job, phase)
        for metric in (
            self.passes,
            self.examples,
            self.skipped_files,
            self.pass_duration,
            self.donefile_wait,
            self.auc,
            self.loss,
            self.copc,
            self.exports,
            self.checkpoints,
            self.generation,
        ):
            with contextlib.suppress(KeyError):  # never observed for this job
                metric.remove(namespace, job)
        for role in ROLES:
            with contextlib.suppress(KeyError):
                self.restarts.remove(namespace, job, role)
