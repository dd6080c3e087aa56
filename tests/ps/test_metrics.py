"""PS metrics: an injected registry, RPC latency and error series, and the scrape-time
collector reading a real shard."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from streamtrain_ps.api import SparsePush
from streamtrain_ps.errors import UnknownTableError
from streamtrain_ps.service.metrics import PSMetrics
from streamtrain_ps.shard import Shard

from .conftest import Cluster, SpawnedPS, small_config


def test_rpc_series_use_the_injected_registry_only() -> None:
    registry = CollectorRegistry()
    metrics = PSMetrics(registry, shard=3)
    metrics.observe_rpc("PullSparse", "OK", 0.002)
    metrics.observe_rpc("PullSparse", "NOT_FOUND", 0.001)
    metrics.observe_save("delta", 1.5)
    metrics.observe_load(2.0)
    value = registry.get_sample_value
    assert (
        value("streamtrain_ps_rpc_duration_seconds_count", {"method": "PullSparse", "shard": "3"})
        == 2
    )
    assert (
        value(
            "streamtrain_ps_rpc_errors_total",
            {"method": "PullSparse", "code": "NOT_FOUND", "shard": "3"},
        )
        == 1
    )
    assert value("streamtrain_ps_save_duration_seconds_sum", {"mode": "delta", "shard": "3"}) == 1.5
    assert value("streamtrain_ps_load_duration_seconds_count", {"shard": "3"}) == 1
    assert REGISTRY.get_sample_value("streamtrain_ps_rpc_duration_seconds_count") is None
    # two shards in one process do not collide
    PSMetrics(CollectorRegistry(), shard=4)


def test_collector_reads_the_shard_at_scrape_time() -> None:
    shard = Shard(small_config())
    registry = CollectorRegistry()
    PSMetrics(registry, shard=0, stats=shard.stats)
    labels = {"table": "embedding", "shard": "0"}
    assert registry.get_sample_value("streamtrain_ps_keys", labels) == 0
    keys = np.arange(1, 11, dtype=np.uint64)
    shard.push_sparse(
        "embedding",
        SparsePush(
            keys, np.zeros((10, 5), np.float32), np.ones(10, np.float32), np.zeros(10, np.float32)
        ),
    )
    assert registry.get_sample_value("streamtrain_ps_keys", labels) == 10
    assert registry.get_sample_value("streamtrain_ps_expanded_keys", labels) == 10
    assert registry.get_sample_value("streamtrain_ps_admissions_total", labels) == 10
    assert registry.get_sample_value("streamtrain_ps_evictions_total", labels) == 0
    memory = registry.get_sample_value("streamtrain_ps_memory_bytes", labels)
    assert memory is not None and memory > 10 * 4 * (7 + 5)
    assert registry.get_sample_value("streamtrain_ps_keys", {"table": "other", "shard": "0"}) == 0
    assert (
        registry.get_sample_value("streamtrain_ps_last_save_duration_seconds", {"shard": "0"}) == 0
    )
    text = generate_latest(registry).decode()
    assert "# TYPE streamtrain_ps_admissions_total counter" in text
    assert "# TYPE streamtrain_ps_memory_bytes gauge" in text


def test_server_records_latency_and_errors_by_method(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(1)
    ps = cluster.client()
    ps.pull_sparse("embedding", np.arange(5, dtype=np.uint64))
    with pytest.raises(UnknownTableError):
        ps.pull_dense("missing")
    registry = cluster.servers[0].registry
    assert (
        registry.get_sample_value(
            "streamtrain_ps_rpc_duration_seconds_count", {"method": "PullSparse", "shard": "0"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "streamtrain_ps_rpc_errors_total",
            {"method": "PullDense", "code": "NOT_FOUND", "shard": "0"},
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "streamtrain_ps_rpc_errors_total",
            {"method": "PullSparse", "code": "NOT_FOUND", "shard": "0"},
        )
        is None
    )


def test_metrics_port_serves_prometheus_text(spawn_ps: Callable[..., SpawnedPS]) -> None:
    spawned = spawn_ps(small_config(), "--metrics-port", "0")
    (line,) = [text for text in spawned.startup if "metrics on http://" in text]
    url = line.split("metrics on ", 1)[1].strip()
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    assert 'streamtrain_ps_keys{shard="0",table="embedding"} 0.0' in text
    spawned.process.terminate()
    assert spawned.process.wait(timeout=30) == 0
