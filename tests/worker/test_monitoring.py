"""The worker's quality gauges never export a placeholder for an undefined metric.

An empty share of a pass (fewer files than workers, files of skipped lines) trains nothing;
its AUC and loss are undefined. The gauges must keep the last defined value instead of
dropping to 0.5 / 0 (a fake quality drop) or NaN (a gap that breaks comparisons).
"""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry

from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.monitoring import WorkerMetrics
from streamtrain_worker.training.train import Trainer

SLOTS = 3


def batches(count: int, size: int = 64) -> list[Batch]:
    """One key per slot; clicks likelier for low keys of slot 0 (both classes present)."""
    rng = np.random.default_rng(5)
    out = []
    for _ in range(count):
        keys = rng.integers(0, 50, size=(size, SLOTS)) + np.arange(SLOTS) * 1000
        labels = (rng.random(size) < np.where(keys[:, 0] < 10, 0.6, 0.1)).astype(np.float32)
        offsets = np.arange(size * SLOTS + 1, dtype=np.int64)
        out.append(Batch(labels, keys.ravel().astype(np.uint64), offsets, num_slots=SLOTS))
    return out


def test_undefined_values_leave_the_gauges_at_their_last_defined_value() -> None:
    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    assert registry.get_sample_value("streamtrain_worker_auc") == 0.0  # never set yet
    m.auc.set(0.71)
    m.loss.set(0.43)
    for undefined in (None, math.nan, math.inf):
        m.auc.set(undefined)
        m.loss.set(undefined)
    assert registry.get_sample_value("streamtrain_worker_auc") == 0.71
    assert registry.get_sample_value("streamtrain_worker_loss") == 0.43


def test_an_empty_pass_counts_as_a_pass_but_does_not_touch_auc_and_loss() -> None:
    cfg = WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": SLOTS},
            "model": {"embeddingDim": 4, "hiddenUnits": [8], "batchSize": 64},
            "metrics": {"numBuckets": 1024},
            "ps": {"config": {"logicalShards": 2, "tables": [{"embedxDim": 4}]}},
        }
    )
    registry = CollectorRegistry()
    trainer = Trainer(cfg, LocalPS(cfg.ps.config), SLOTS, monitoring=WorkerMetrics(registry))
    try:
        first = trainer.run_pass(batches(3))
        empty = trainer.run_pass([])
    finally:
        trainer.close()
    assert first.auc is not None and first.loss is not None
    assert empty.empty and empty.auc is None and empty.loss is None
    assert registry.get_sample_value("streamtrain_worker_passes_total") == 2
    assert registry.get_sample_value("streamtrain_worker_auc") == first.auc
    assert registry.get_sample_value("streamtrain_worker_loss") == first.loss
