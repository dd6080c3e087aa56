"""Prometheus metrics of one PS shard, registered in an injected ``CollectorRegistry``.

Two kinds of series:

- observed by the servicer on every RPC: ``streamtrain_ps_rpc_duration_seconds{method}``
  (histogram), ``streamtrain_ps_rpc_errors_total{method,code}``, and the durations of saves
  and loads (``streamtrain_ps_save_duration_seconds``, ``streamtrain_ps_load_duration_seconds``);
- read from ``shard.stats()`` at scrape time by a custom collector (keys, expanded keys and
  memory per table, admissions and evictions, the latest save and load durations), so the
  hot path never touches a gauge.

Every series carries the ``shard`` label (the shard index) so a PromQL sum over shards needs
no relabelling. Nothing here touches prometheus-client's global default registry: tests and
several shards in one process each get their own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: RPC latencies span ~100 µs (small pulls) to minutes (saves of big tables).
RPC_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
    60.0,
    300.0,
)
IO_BUCKETS: tuple[float, ...] = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1200.0, 3600.0)


class TableStatsLike(Protocol):
    """What the collector reads of one table (``streamtrain_ps.shard`` provides it)."""

    @property
    def name(self) -> str: ...
    @property
    def keys(self) -> int: ...
    @property
    def expanded_keys(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def admissions_total(self) -> int: ...
    @property
    def evictions_total(self) -> int: ...
    @property
    def refused_total(self) -> int: ...
    @property
    def ram_bytes(self) -> int: ...
    @property
    def disk_keys(self) -> int: ...
    @property
    def disk_bytes(self) -> int: ...
    @property
    def promotions_total(self) -> int: ...
    @property
    def demotions_total(self) -> int: ...
    @property
    def pressure_evictions_total(self) -> int: ...


class ShardStatsLike(Protocol):
    @property
    def tables(self) -> Sequence[TableStatsLike]: ...
    @property
    def last_save_seconds(self) -> float: ...
    @property
    def last_load_seconds(self) -> float: ...
    @property
    def memory_limit_bytes(self) -> int: ...
    @property
    def peak_rss_bytes(self) -> int: ...


class ShardCollector(Collector):
    """Reads the shard's counters when Prometheus scrapes, not on every push."""

    def __init__(self, stats: Callable[[], ShardStatsLike], shard: str) -> None:
        self._stats = stats
        self._shard = shard

    def describe(self) -> Iterable[Metric]:
        # Declaring the families without reading the shard keeps registration cheap and
        # lets the registry detect duplicate names.
        return [*self._families(), *self._last_families(), *self._tier_families()]

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        keys, expanded, memory, admissions, evictions, refused = families
        stats = self._stats()
        for t in stats.tables:
            labels = [t.name, self._shard]
            keys.add_metric(labels, t.keys)
            expanded.add_metric(labels, t.expanded_keys)
            memory.add_metric(labels, t.memory_bytes)
            admissions.add_metric(labels, t.admissions_total)
            evictions.add_metric(labels, t.evictions_total)
            refused.add_metric(labels, t.refused_total)
        last_save, last_load = self._last_families()
        last_save.add_metric([self._shard], stats.last_save_seconds)
        last_load.add_metric([self._shard], stats.last_load_seconds)
        tier = self._tier_families()
        disk_keys, tier_bytes, promotions, demotions, pressure, limit, peak = tier
        for t in stats.tables:
            labels = [t.name, self._shard]
            disk_keys.add_metric(labels, t.disk_keys)
            tier_bytes.add_metric([*labels, "ram"], t.ram_bytes)
            tier_bytes.add_metric([*labels, "disk"], t.disk_bytes)
            promotions.add_metric(labels, t.promotions_total)
            demotions.add_metric(labels, t.demotions_total)
            pressure.add_metric(labels, t.pressure_evictions_total)
        limit.add_metric([self._shard], stats.memory_limit_bytes)
        peak.add_metric([self._shard], stats.peak_rss_bytes)
        return [*families, last_save, last_load, *tier]

    @staticmethod
    def _tier_families() -> tuple[GaugeMetricFamily | CounterMetricFamily, ...]:
        """The memory limit and the disk tier (``streamtrain_ps.tier.tiering``)."""
        labels = ["table", "shard"]
        return (
            GaugeMetricFamily(
                "streamtrain_ps_disk_keys", "Keys held by the disk tier.", labels=labels
            ),
            GaugeMetricFamily(
                "streamtrain_ps_tier_bytes",
                "Live bytes of the table per tier (ram: what memoryLimit counts; disk).",
                labels=[*labels, "tier"],
            ),
            CounterMetricFamily(
                "streamtrain_ps_promotions", "Keys moved from disk to RAM.", labels=labels
            ),
            CounterMetricFamily(
                "streamtrain_ps_demotions", "Keys moved from RAM to disk.", labels=labels
            ),
            CounterMetricFamily(
                "streamtrain_ps_pressure_evictions",
                "Keys evicted because RAM and the disk tier were full (also in evictions).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "streamtrain_ps_memory_limit_bytes",
                "The shard's memoryLimit (0: unlimited).",
                labels=["shard"],
            ),
            GaugeMetricFamily(
                "streamtrain_ps_peak_rss_bytes",
                "Peak resident memory of the shard process.",
                labels=["shard"],
            ),
        )

    @staticmethod
    def _last_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        """The shard's own timing of its latest save and load (0 before the first one)."""
        return (
            GaugeMetricFamily(
                "streamtrain_ps_last_save_duration_seconds",
                "Duration of this shard's latest save.",
                labels=["shard"],
            ),
            GaugeMetricFamily(
                "streamtrain_ps_last_load_duration_seconds",
                "Duration of this shard's latest load.",
                labels=["shard"],
            ),
        )

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
    ]:
        labels = ["table", "shard"]
        return (
            GaugeMetricFamily("streamtrain_ps_keys", "Keys in the sparse table.", labels=labels),
            GaugeMetricFamily(
                "streamtrain_ps_expanded_keys",
                "Keys whose embedx has been admitted (score >= embedxThreshold).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "streamtrain_ps_memory_bytes",
                "Bytes held by the table's index and value slabs.",
                labels=labels,
            ),
            CounterMetricFamily(
                "streamtrain_ps_admissions", "Keys whose embedx was admitted.", labels=labels
            ),
            CounterMetricFamily(
                "streamtrain_ps_evictions", "Keys deleted by shrink.", labels=labels
            ),
            CounterMetricFamily(
                "streamtrain_ps_refused_updates",
                "Key updates of pushes refused because the row would hold inf or NaN.",
                labels=labels,
            ),
        )


class PSMetrics:
    """The shard's metric objects; ``observe_*`` are what the servicer calls."""

    def __init__(
        self,
        registry: CollectorRegistry,
        shard: int | str = 0,
        stats: Callable[[], ShardStatsLike] | None = None,
    ) -> None:
        self.registry = registry
        self.shard = str(shard)
        self._rpc = Histogram(
            "streamtrain_ps_rpc_duration_seconds",
            "Server-side duration of PS RPCs, including decoding and encoding.",
            ["method", "shard"],
            registry=registry,
            buckets=RPC_BUCKETS,
        )
        self._errors = Counter(
            "streamtrain_ps_rpc_errors_total",
            "PS RPCs that ended with a non-OK status.",
            ["method", "code", "shard"],
            registry=registry,
        )
        self._save = Histogram(
            "streamtrain_ps_save_duration_seconds",
            "Duration of shard saves (writing this shard's parts).",
            ["mode", "shard"],
            registry=registry,
            buckets=IO_BUCKETS,
        )
        self._load = Histogram(
            "streamtrain_ps_load_duration_seconds",
            "Duration of shard loads (reading and verifying parts).",
            ["shard"],
            registry=registry,
            buckets=IO_BUCKETS,
        )
        self._duplicates = Counter(
            "streamtrain_ps_duplicate_pushes_total",
            "Retried pushes recognised by their request id and not applied again.",
            ["method", "shard"],
            registry=registry,
        )
        if stats is not None:
            registry.register(ShardCollector(stats, self.shard))

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """Record one RPC; ``code`` is the gRPC status name (``OK``, ``INVALID_ARGUMENT``...)."""
        self._rpc.labels(method=method, shard=self.shard).observe(seconds)
        if code != "OK":
            self._errors.labels(method=method, code=code, shard=self.shard).inc()

    def observe_save(self, mode: str, seconds: float) -> None:
        self._save.labels(mode=mode, shard=self.shard).observe(seconds)

    def observe_duplicate(self, method: str) -> None:
        self._duplicates.labels(method=method, shard=self.shard).inc()

    def observe_load(self, seconds: float) -> None:
        self._load.labels(shard=self.shard).observe(seconds)
