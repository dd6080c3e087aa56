r"""The worker's Prometheus series, registered on an injected registry.

Names follow docs/design.md §5: ``streamtrain_worker_`` prefix, ``_total`` counters,
``_seconds`` durations. No pass/day labels (unbounded cardinality); the pass-level view
comes from the scheduler's merged metrics.

A worker's share of a pass can be empty (fewer files than workers, an empty folder set, files
of skipped lines) or hold a single class; its loss and AUC are then undefined (``None`` from
``metrics.py``). The quality gauges are :class:`DefinedGauge`\s: an undefined value leaves
them at the last defined one instead of exporting a placeholder (0.5) or NaN — an empty
share trained nothing, so the last measured value still describes this worker's model, and
neither a fake drop nor a NaN gap reaches dashboards and alerts.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: PS latencies span sub-millisecond in-process calls to seconds over a busy network.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class DefinedGauge:
    """A gauge that keeps its last defined value: ``set(None)`` / ``set(nan)`` change nothing."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge

    def set(self, value: float | None) -> None:
        """Export ``value`` if it is a defined, finite number; else keep the last one."""
        if value is not None and math.isfinite(value):
            self.gauge.set(value)


class WorkerMetrics:
    """Counters, gauges and histograms of one worker process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        prefix = "streamtrain_worker"
        self.examples = Counter(
            f"{prefix}_examples",
            "Examples processed (tested, and trained when training)",
            registry=registry,
        )
        self.batches = Counter(f"{prefix}_batches", "Mini-batches processed", registry=registry)
        self.bad_lines = Counter(
            f"{prefix}_bad_lines", "Input lines skipped as malformed", registry=registry
        )
        self.passes = Counter(f"{prefix}_passes", "Passes completed", registry=registry)
        self.read_ahead = Counter(
            f"{prefix}_read_ahead",
            "Passes read ahead, by what became of them (used; changed since, so read again; "
            "dropped unused)",
            ["outcome"],
            registry=registry,
        )
        self.loss = DefinedGauge(
            Gauge(
                f"{prefix}_loss",
                "Mean log loss of the last completed pass with examples",
                registry=registry,
            )
        )
        self.auc = DefinedGauge(
            Gauge(
                f"{prefix}_auc",
                "This worker's AUC on its share of the last pass with both classes",
                registry=registry,
            )
        )
        self.examples_per_second = Gauge(
            f"{prefix}_examples_per_second",
            "Throughput of the last completed pass",
            registry=registry,
        )
        self.pull_seconds = Histogram(
            f"{prefix}_ps_pull_seconds",
            "Latency of one sparse pull of a batch's unique keys",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.push_seconds = Histogram(
            f"{prefix}_ps_push_seconds",
            "Latency of one batch's sparse + dense push",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
