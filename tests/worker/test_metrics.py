"""Pass metrics: bucketed AUC against a rank-based AUC, exact merging across workers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamtrain_worker.metrics import (
    DERIVED_METRICS,
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


def on_bucket_centres(preds: np.ndarray, num_buckets: int) -> np.ndarray:
    """``preds`` moved to the centre of their bucket ``[k/n, (k+1)/n)``, computed here and
    not with the product's ``bucket_index``: predictions that share a bucket become equal,
    so the bucketed AUC must be exactly the rank AUC of these (ties counted half)."""
    k = np.minimum((preds * num_buckets).astype(np.int64), num_buckets - 1)
    return (k + 0.5) / num_buckets


def test_bucketed_auc_equals_rank_auc_of_predictions_on_bucket_centres() -> None:
    preds, labels, losses = sample(0, 5000)
    centred = on_bucket_centres(preds, 1000)
    m = PassMetrics(num_buckets=1000)
    m.add(centred, labels, losses)
    assert m.auc == pytest.approx(rank_auc(centred, labels), abs=1e-12)
    # and with fine buckets it is the AUC of the raw predictions up to bucket ties.
    fine = PassMetrics(num_buckets=1 << 20)
    fine.add(preds, labels, losses)
    assert fine.auc == pytest.approx(rank_auc(preds, labels), abs=1e-4)


def test_a_prediction_lands_in_the_bucket_its_value_names() -> None:
    # Bucket k holds [k/n, (k+1)/n); 1.0 and anything above go to the last, below 0 to the
    # first (hand-written expectations: an edge moved by one changes some of them).
    preds = [-0.5, 0.0, 0.2499, 0.25, 0.5, 0.7499, 0.75, 0.9999, 1.0, 7.0]
    assert bucket_index(preds, 4).tolist() == [0, 0, 0, 1, 2, 2, 3, 3, 3, 3]
    # Two predictions one bucket apart are ranked, two in one bucket are a tie.
    m = PassMetrics(num_buckets=4)
    m.add(np.array([0.26, 0.24]), np.array([1.0, 0.0]), np.zeros(2))
    assert m.auc == 1.0
    tie = PassMetrics(num_buckets=4)
    tie.add(np.array([0.26, 0.49]), np.array([0.0, 1.0]), np.zeros(2))
    assert tie.auc == 0.5


def pair_count_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Positive/negative pairs ranked right (ties half), counted in Python integers."""
    right = 0  # twice the count, so a tie adds 1
    negatives_below = 0
    for p, n in zip(pos.tolist(), neg.tolist(), strict=True):
        right += p * (2 * negatives_below + n)
        negatives_below += n
    return right / 2 / (sum(pos.tolist()) * sum(neg.tolist()))


def test_bucketed_auc_is_the_exact_pair_count_on_a_full_histogram() -> None:
    # 65,536 buckets, as the jobs use: the area is a sum of whole numbers, exact in float64
    # whatever the order of summation (no BLAS dot product: metrics.py).
    rng = np.random.default_rng(5)
    for _ in range(20):
        pos = np.zeros(1 << 16, np.uint64)
        neg = np.zeros(1 << 16, np.uint64)
        n = int(rng.integers(100, 100_000))
        np.add.at(pos, rng.integers(0, 1 << 16, n // 4 + 1), np.uint64(1))
        np.add.at(neg, rng.integers(0, 1 << 16, n), np.uint64(1))
        assert auc_from_histograms(pos, neg) == pair_count_auc(pos, neg)


def test_auc_edge_cases() -> None:
    # No positive/negative pair: undefined, not the 0.5 of a coin flip.
    assert auc_from_histograms(np.zeros(10), np.zeros(10)) is None
    assert auc_from_histograms(np.array([0, 0, 3]), np.zeros(3)) is None
    assert auc_from_histograms(np.zeros(3), np.array([1, 0, 2])) is None
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
    for name in DERIVED_METRICS:
        # (bucket_error is undefined for both here: 4000 examples over 4096 buckets leave no
        # window with enough impressions; what matters is that both sides agree.)
        expected = getattr(single, name)
        got = getattr(merged, name)
        assert got is None if expected is None else got == pytest.approx(expected, rel=1e-9), name
    # a mean of the per-worker AUCs is generally not the global AUC; ours is exact
    centred = on_bucket_centres(preds, 4096)
    exact = PassMetrics(num_buckets=4096)
    exact.add(centred, labels, losses)
    assert exact.auc == pytest.approx(rank_auc(centred, labels), abs=1e-12)
    assert merged.auc == exact.auc == single.auc


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
    assert bucket_error_from_histograms(np.zeros(100), np.zeros(100)) is None
    # Too few impressions for any window to estimate its CTR: undefined, not "calibrated".
    few = np.zeros(100)
    few[50] = 1
    assert bucket_error_from_histograms(few, few) is None


def test_bucket_error_of_sparse_histograms_is_the_bucket_by_bucket_walk() -> None:
    """A pass fills a few thousand of 65,536 buckets: the walk over the non-empty ones
    (with the window starts that empty stretches make) equals the literal walk."""
    rng = np.random.default_rng(11)
    defined = 0
    for trial in range(300):
        size = int(rng.choice([7, 100, 1000, 65536]))
        preds = rng.beta(rng.uniform(0.2, 3), rng.uniform(0.5, 30), int(rng.integers(1, 30_000)))
        labels = (rng.random(preds.shape[0]) < preds).astype(np.float64)
        m = PassMetrics(num_buckets=size)
        m.add(preds, labels if trial % 5 else np.zeros_like(labels), np.zeros_like(preds))
        expected = reference_bucket_error(m.pos.astype(float), m.neg.astype(float))
        if m.bucket_error is None:
            assert expected == 0.0
        else:
            defined += 1
            assert m.bucket_error == pytest.approx(expected, rel=1e-12), (trial, size)
    assert defined > 50  # most small or one-class samples leave it undefined


def test_an_empty_pass_defines_only_its_example_count() -> None:
    m = PassMetrics(num_buckets=100)
    m.add(np.zeros(0), np.zeros(0), np.zeros(0))  # a batch of nothing, as a reader may send
    assert m.empty and m.examples == 0
    for name in DERIVED_METRICS:
        assert getattr(m, name) is None, name
    assert m.summary() == {"examples": 0.0}
    # ... and stays so through the wire form and a merge with other empty shares.
    merged = PassMetrics.sum([PassMetrics.from_proto(m.to_proto()), m], 100)
    assert merged.summary() == {"examples": 0.0}


def test_a_one_class_pass_has_no_auc_but_its_other_metrics() -> None:
    preds = np.array([0.1, 0.2, 0.3, 0.4])
    losses = -np.log(1 - preds)
    m = PassMetrics(num_buckets=1000)
    m.add(preds, np.zeros(4), losses)  # a quiet night: impressions, no click
    summary = m.summary()
    assert m.auc is None and "auc" not in summary
    assert summary["examples"] == 4 and summary["loss"] == pytest.approx(losses.mean())
    assert summary["copc"] == 0.0  # no click against 1.0 predicted: defined, and bad
    assert summary["mae"] == pytest.approx(0.25) and summary["actual_ctr"] == 0.0
    # The other class alone is just as undefined; both together define it again.
    clicks = PassMetrics(num_buckets=1000)
    clicks.add(np.array([0.9]), np.ones(1), np.array([0.1]))
    assert clicks.auc is None
    assert m.merge(clicks).auc == 1.0


def test_copc_is_undefined_when_nothing_was_predicted() -> None:
    m = PassMetrics(num_buckets=10)
    m.add(np.zeros(3), np.array([0.0, 1.0, 0.0]), np.ones(3))
    assert m.copc is None and "copc" not in m.summary()
    assert m.auc == 0.5  # all tied in one bucket: a defined AUC of exactly 0.5


def test_wire_form_rejects_bad_histograms() -> None:
    msg = PassMetrics(num_buckets=100).to_proto()
    msg.pos_buckets = msg.pos_buckets[:-8]
    with pytest.raises(ValueError, match="pos_buckets"):
        PassMetrics.from_proto(msg)
    with pytest.raises(ValueError, match="cannot merge"):
        PassMetrics(num_buckets=100).merge(PassMetrics(num_buckets=200))
