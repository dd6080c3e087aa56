"""Pass metrics: bucketed AUC against a rank-based AUC, exact merging across workers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamtrain_worker.metrics import (
    PassMetrics,
    auc_from_histograms,
    bucket_error_from_histograms,
    bucket_index,
)


def rank_auc(preds: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties (the textbook definition)."""
    order = np.argsort(preds, kind="mergesort")
    sorted_p = preds[order]
    ranks = np.empty(len(preds), dtype=np.float64)
    i = 0
    while i < len(preds):
        j = i
        while j + 1 < len(preds) and sorted_p[j + 1] == sorted_p[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def sample(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    preds = rng.beta(1.0, 4.0, size=n)
    labels = (rng.random(n) < preds).astype(np.float32)
    eps = 1e-7
    losses = -(labels * np.log(preds + eps) + (1 - labels) * np.log(1 - preds + eps))
    return preds, labels, losses


def test_bucketed_auc_equals_rank_auc_of_bucketed_scores() -> None:
    preds, labels, losses = sample(0, 5000)
    m = PassMetrics(num_buckets=1000)
    m.add(preds, labels, losses)
    # Bucketing only turns predictions into their bucket index: the rank AUC of the
    # bucket indices (ties counted half) is exactly what the histogram walk computes.
    assert m.auc == pytest.approx(
        rank_auc(bucket_index(preds, 1000).astype(float), labels), abs=1e-12
    )
    # and with fine buckets it is the AUC of the raw predictions up to bucket ties.
    fine = PassMetrics(num_buckets=1 << 20)
    fine.add(preds, labels, losses)
    assert fine.auc == pytest.approx(rank_auc(preds, labels), abs=1e-4)


def test_auc_edge_cases() -> None:
    assert auc_from_histograms(np.zeros(10), np.zeros(10)) == 0.5
    assert auc_from_histograms(np.array([0, 0, 3]), np.zeros(3)) == 0.5
    assert auc_from_histograms(np.array([0, 0, 3]), np.array([2, 0, 0])) == 1.0
    assert auc_from_histograms(np.array([2, 0, 0]), np.array([0, 0, 3])) == 0.0
    assert auc_from_histograms(np.array([0, 4, 0]), np.array([0, 5, 0])) == 0.5


def test_two_workers_summed_equal_single_process() -> None:
    preds, labels, losses = sample(1, 4000)
    single = PassMetrics(num_buckets=4096)
    single.add(preds, labels, losses)
    w0, w1 = PassMetrics(num_buckets=4096), PassMetrics(num_buckets=4096)
    for start in range(0, 4000, 256):  # batches interleaved between two workers
        target = w0 if (start // 256) % 2 == 0 else w1
        sl = slice(start, start + 256)
        target.add(preds[sl], labels[sl], losses[sl])
    # through the wire form, as the scheduler sees them
    merged = PassMetrics.sum(
        [PassMetrics.from_proto(w.to_proto("20261101", 1, 3)) for w in (w0, w1)], 4096
    )
    assert np.array_equal(merged.pos, single.pos)
    assert np.array_equal(merged.neg, single.neg)
    assert merged.examples == 4000
    assert abs(merged.auc - single.auc) < 1e-6
    for name in ("loss", "copc", "mae", "rmse", "bucket_error", "actual_ctr", "predicted_ctr"):
        assert getattr(merged, name) == pytest.approx(getattr(single, name), rel=1e-9), name
    # a mean of the per-worker AUCs is generally not the global AUC; ours is exact
    assert merged.auc == pytest.approx(rank_auc(bucket_index(preds, 4096).astype(float), labels))


def test_error_metrics_match_direct_formulas() -> None:
    preds, labels, losses = sample(2, 3000)
    m = PassMetrics(num_buckets=65536)
    m.add(preds, labels, losses)
    assert m.copc == pytest.approx(labels.sum() / preds.sum())
    assert m.mae == pytest.approx(np.abs(preds - labels).mean())
    assert m.rmse == pytest.approx(math.sqrt(((preds - labels) ** 2).mean()))
    assert m.loss == pytest.approx(losses.mean())
    assert m.actual_ctr == pytest.approx(labels.mean())


def reference_bucket_error(pos: np.ndarray, neg: np.ndarray) -> float:
    """A literal transcription of the definition in the module docstring."""
    size = len(pos)
    last_ctr, imp, ctr_sum, click_sum, err, cnt = -1.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for i in range(size):
        ctr = i / size
        if abs(ctr - last_ctr) > 0.01:
            last_ctr, imp, ctr_sum, click_sum = ctr, 0.0, 0.0, 0.0
        imp += pos[i] + neg[i]
        ctr_sum += ctr * (pos[i] + neg[i])
        click_sum += pos[i]
        if imp == 0 or ctr_sum == 0:
            continue
        adjust = ctr_sum / imp
        if math.sqrt((1 - adjust) / (adjust * imp)) < 0.05:
            err += abs(click_sum / imp / adjust - 1) * imp
            cnt += imp
            last_ctr = -1.0
    return err / cnt if cnt else 0.0


def test_bucket_error() -> None:
    preds, labels, losses = sample(3, 300_000)
    m = PassMetrics(num_buckets=1000)
    m.add(preds, labels, losses)
    expected = reference_bucket_error(m.pos.astype(float), m.neg.astype(float))
    assert m.bucket_error == pytest.approx(expected, rel=1e-12)
    assert 0 < m.bucket_error < 0.2  # calibrated predictions: only sampling noise
    # a model predicting half the true CTR is off by ~100 %
    biased = PassMetrics(num_buckets=1000)
    biased.add(preds / 2, labels, losses)
    assert biased.bucket_error > 0.7
    assert bucket_error_from_histograms(np.zeros(100), np.zeros(100)) == 0.0


def test_wire_form_rejects_bad_histograms() -> None:
    msg = PassMetrics(num_buckets=100).to_proto()
    msg.pos_buckets = msg.pos_buckets[:-8]
    with pytest.raises(ValueError, match="pos_buckets"):
        PassMetrics.from_proto(msg)
    with pytest.raises(ValueError, match="cannot merge"):
        PassMetrics(num_buckets=100).merge(PassMetrics(num_buckets=200))
