"""Pass metrics that merge exactly across workers: AUC histograms and error sums.

Every worker accumulates, per pass, sums and two histograms — positives and negatives per
prediction bucket — instead of an AUC. Summing these over workers gives exactly the
histograms one process would have built over all examples, so the global AUC is computed
once from the summed histograms and never averaged (an average of per-worker AUCs is not
an AUC). This module is numpy only: the scheduler imports it to merge ``PassResult``s.

Definitions (``n`` = number of buckets, ``p`` = predicted CTR, ``y`` = label in {0, 1}):

- bucket of a prediction: ``min(floor(p * n), n - 1)`` (Paddle's ``BasicAucCalculator``).
- AUC: walk buckets from the highest score to the lowest, accumulating true and false
  positive counts and adding the trapezoid under each step; divide by ``P * N``. Examples
  in the same bucket count as ties (half a pair). Undefined (``None``) when ``P`` or ``N``
  is 0: there is no positive/negative pair to rank.
- loss: mean log loss ``-(y log p + (1 - y) log(1 - p))`` (p clipped by the model).
- COPC: actual clicks / predicted clicks = ``sum(y) / sum(p)`` (1.0 is calibrated).
- MAE ``sum|p - y| / examples``, RMSE ``sqrt(sum (p - y)^2 / examples)``.
- bucket error (Paddle's ``calculate_bucket_error``): walk buckets from low to high score,
  growing a window of adjacent buckets (at most ``MAX_SPAN`` = 0.01 of CTR wide). Once the
  window holds enough impressions that the binomial relative standard error of its mean
  predicted CTR ``c`` — ``sqrt((1 - c) / (c * impressions))`` — falls below
  ``RELATIVE_ERROR_BOUND`` = 0.05, record ``|actual_ctr / c - 1|`` weighted by the window's
  impressions and start a new window. The result is the impression-weighted mean relative
  calibration error over windows (undefined when no window qualified). Bucket ``i``'s CTR
  is its lower edge ``i / n``, as in Paddle.

**Undefined metrics are ``None``, never a placeholder.** A pass with zero examples (an
empty folder set, or files of skipped lines) has no loss, COPC, MAE, RMSE or CTR; a pass
with a single class has no AUC; a pass where nothing was predicted has no COPC. Returning
0.5 / 0 / 1 for these (as this module once did) made a quiet night look like a model that
lost all quality: the placeholder reached the status, the progress line, the Prometheus
gauges, the export manifests and the AUC-drop alert. :meth:`PassMetrics.summary` therefore
lists only the defined metrics (``examples`` always), and every consumer treats a missing
key as "undefined" (``docs/scheduler.md``, "Empty passes and undefined metrics").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_worker.proto import worker_pb2

MAX_SPAN = 0.01
RELATIVE_ERROR_BOUND = 0.05
#: The COPC range a pass counts as calibrated in (issue 26's band; the quality bench and
#: the demo report how many passes fall in it).
COPC_BAND = (0.9, 1.1)
#: The derived metrics of :meth:`PassMetrics.summary`, each ``None`` where undefined.
DERIVED_METRICS = (
    "auc",
    "loss",
    "copc",
    "mae",
    "rmse",
    "bucket_error",
    "actual_ctr",
    "predicted_ctr",
)

U64 = npt.NDArray[np.uint64]


def format_metric(value: float | None, spec: str = ".4f") -> str:
    """``value`` for a log line, ``n/a`` when undefined (never a made-up number)."""
    return "n/a" if value is None else format(value, spec)


def bucket_index(preds: npt.ArrayLike, num_buckets: int) -> npt.NDArray[np.int64]:
    """Histogram bucket of each predicted CTR (values outside [0, 1] are clamped)."""
    p = np.asarray(preds, dtype=np.float64)
    idx = np.floor(p * num_buckets).astype(np.int64)
    return np.clip(idx, 0, num_buckets - 1)


def auc_from_histograms(pos: npt.ArrayLike, neg: npt.ArrayLike) -> float | None:
    """AUC from per-bucket positive/negative counts (ties within a bucket count half).

    ``None`` without both classes: AUC is a probability over (positive, negative) pairs,
    and with no pair any number (0.5 included) would be invented.
    """
    p = np.asarray(pos, dtype=np.float64)[::-1]
    n = np.asarray(neg, dtype=np.float64)[::-1]
    total_pos = float(p.sum())
    total_neg = float(n.sum())
    if total_pos == 0 or total_neg == 0:
        return None
    tp_after = np.cumsum(p)
    tp_before = tp_after - p
    # Not ``np.dot``: numpy's OpenBLAS splits a dot of 65,536 values over its threads, which
    # took 15-35 ms instead of 0.03 on a loaded 2-core box, its threads competing with
    # training (the worker computes this twice a pass, the driver once). The terms are whole
    # numbers (counts), so any order of summation gives the same result below 2**53.
    area = float(np.multiply(n, tp_before + tp_after).sum()) / 2.0
    return area / (total_pos * total_neg)


def bucket_error_from_histograms(pos: npt.ArrayLike, neg: npt.ArrayLike) -> float | None:
    """Paddle's bucket error (module docstring), from per-bucket counts.

    ``None`` when no window held enough impressions to estimate its CTR (always so for an
    empty pass): Paddle reports 0 there, which reads as "perfectly calibrated".

    The walk visits only the non-empty buckets: an empty bucket adds nothing to a window,
    so all it can do is start a new one (when it lies more than ``MAX_SPAN`` past the
    window's start), and those starts are found by :func:`_next_window_start` in a step
    each. The result is the bucket-by-bucket walk's, bit for bit (the same float
    operations in the same order), at the cost of the buckets a pass fills (a few
    thousand) instead of all 65,536: the driver computes it for every pass.
    """
    clicks = np.asarray(pos, dtype=np.float64)
    shows = clicks + np.asarray(neg, dtype=np.float64)
    size = shows.shape[0]
    nonzero = np.flatnonzero(shows)
    if nonzero.size == 0:
        return None
    click_list = clicks[nonzero].tolist()
    show_list = shows[nonzero].tolist()
    last_ctr = -1.0
    impressions = ctr_sum = click_sum = 0.0
    error_sum = error_count = 0.0
    unvisited = 0  # the first bucket whose window start has not been checked yet
    for i, show, click in zip(nonzero.tolist(), show_list, click_list, strict=True):
        ctr = i / size
        if abs(ctr - last_ctr) > MAX_SPAN:  # a new window starts here or at a bucket before
            start = _next_window_start(unvisited, last_ctr, size)
            while start <= i:
                last_ctr = start / size
                impressions = ctr_sum = click_sum = 0.0
                start = _next_window_start(start + 1, last_ctr, size)
        unvisited = i + 1
        impressions += show
        ctr_sum += ctr * show
        click_sum += click
        adjust_ctr = ctr_sum / impressions
        if adjust_ctr <= 0.0:
            continue  # zero predicted CTR: infinite relative error, never qualifies
        if math.sqrt((1.0 - adjust_ctr) / (adjust_ctr * impressions)) < RELATIVE_ERROR_BOUND:
            error_sum += abs(click_sum / impressions / adjust_ctr - 1.0) * impressions
            error_count += impressions
            last_ctr = -1.0
    return error_sum / error_count if error_count > 0 else None


def _next_window_start(first: int, last_ctr: float, size: int) -> int:
    """The first bucket ``>= first`` that starts a new window after the window that starts
    at CTR ``last_ctr`` (-1: none open): the walk's test ``|i / size - last_ctr| > MAX_SPAN``,
    evaluated as the walk evaluates it, found from the arithmetic guess by a step or two."""

    def starts(i: int) -> bool:
        return abs(i / size - last_ctr) > MAX_SPAN

    if starts(first):
        return first
    # The test is monotone in i (i / size grows, last_ctr <= first / size): the first i
    # passing it is the smallest one above the guess's rounding.
    guess = max(first + 1, int((last_ctr + MAX_SPAN) * size))
    while guess - 1 > first and starts(guess - 1):
        guess -= 1
    while not starts(guess):
        guess += 1
    return guess


def _u64_bytes(values: U64) -> bytes:
    return np.ascontiguousarray(values, dtype="<u8").tobytes()


def _u64_from_bytes(data: bytes, num_buckets: int, name: str) -> U64:
    if len(data) != 8 * num_buckets:
        raise ValueError(f"{name}: {len(data)} bytes, expected 8 * num_buckets = {8 * num_buckets}")
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


@dataclass
class PassMetrics:
    """Additive metric sums of one worker's pass (or of several merged ones)."""

    num_buckets: int
    pos: U64 = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    neg: U64 = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    examples: int = 0
    bad_lines: int = 0
    files_read: int = 0
    #: Files of the pass that were read ahead while the previous pass trained.
    files_read_ahead: int = 0
    loss_sum: float = 0.0
    label_sum: float = 0.0
    pred_sum: float = 0.0
    abs_error_sum: float = 0.0
    sq_error_sum: float = 0.0
    #: Wall time; merging takes the maximum (workers run in parallel).
    seconds: float = 0.0
    train_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.num_buckets <= 0:
            raise ValueError(f"num_buckets must be positive, got {self.num_buckets}")
        if self.pos.shape[0] == 0:
            self.pos = np.zeros(self.num_buckets, dtype=np.uint64)
        if self.neg.shape[0] == 0:
            self.neg = np.zeros(self.num_buckets, dtype=np.uint64)
        for name, hist in (("pos", self.pos), ("neg", self.neg)):
            if hist.shape != (self.num_buckets,):
                raise ValueError(f"{name} has shape {hist.shape}, expected ({self.num_buckets},)")

    def add(self, preds: npt.ArrayLike, labels: npt.ArrayLike, losses: npt.ArrayLike) -> None:
        """Accumulate one batch: predicted CTRs, 0/1 labels and per-example losses."""
        p = np.asarray(preds, dtype=np.float64).ravel()
        y = np.asarray(labels, dtype=np.float64).ravel()
        loss = np.asarray(losses, dtype=np.float64).ravel()
        if not p.shape == y.shape == loss.shape:
            raise ValueError(f"preds {p.shape}, labels {y.shape}, losses {loss.shape} differ")
        idx = bucket_index(p, self.num_buckets)
        positive = y > 0.5
        # O(batch), not O(num_buckets): a batch touches few of the 65,536 buckets.
        np.add.at(self.pos, idx[positive], np.uint64(1))
        np.add.at(self.neg, idx[~positive], np.uint64(1))
        err = p - y
        self.examples += int(p.shape[0])
        self.loss_sum += float(loss.sum())
        self.label_sum += float(y.sum())
        self.pred_sum += float(p.sum())
        self.abs_error_sum += float(np.abs(err).sum())
        self.sq_error_sum += float(np.dot(err, err))

    def merge(self, other: PassMetrics) -> PassMetrics:
        """The metrics of both passes' examples together (a new object)."""
        if other.num_buckets != self.num_buckets:
            raise ValueError(f"cannot merge {self.num_buckets} buckets with {other.num_buckets}")
        return PassMetrics(
            num_buckets=self.num_buckets,
            pos=self.pos + other.pos,
            neg=self.neg + other.neg,
            examples=self.examples + other.examples,
            bad_lines=self.bad_lines + other.bad_lines,
            files_read=self.files_read + other.files_read,
            files_read_ahead=self.files_read_ahead + other.files_read_ahead,
            loss_sum=self.loss_sum + other.loss_sum,
            label_sum=self.label_sum + other.label_sum,
            pred_sum=self.pred_sum + other.pred_sum,
            abs_error_sum=self.abs_error_sum + other.abs_error_sum,
            sq_error_sum=self.sq_error_sum + other.sq_error_sum,
            seconds=max(self.seconds, other.seconds),
            train_seconds=max(self.train_seconds, other.train_seconds),
        )

    @classmethod
    def sum(cls, parts: list[PassMetrics], num_buckets: int) -> PassMetrics:
        """Merge any number of results (an empty list gives empty metrics)."""
        total = cls(num_buckets=num_buckets)
        for part in parts:
            total = total.merge(part)
        return total

    # --- derived metrics -------------------------------------------------------------

    # Every derived metric is ``None`` where it is undefined (module docstring).

    @property
    def empty(self) -> bool:
        """No example at all: only ``examples`` (0) is defined."""
        return self.examples == 0

    @property
    def auc(self) -> float | None:
        return auc_from_histograms(self.pos, self.neg)

    @property
    def loss(self) -> float | None:
        return self._mean(self.loss_sum)

    @property
    def actual_ctr(self) -> float | None:
        return self._mean(self.label_sum)

    @property
    def predicted_ctr(self) -> float | None:
        return self._mean(self.pred_sum)

    @property
    def copc(self) -> float | None:
        """Actual / predicted clicks; undefined when nothing was predicted."""
        return self.label_sum / self.pred_sum if self.pred_sum > 0 else None

    @property
    def mae(self) -> float | None:
        return self._mean(self.abs_error_sum)

    @property
    def rmse(self) -> float | None:
        mse = self._mean(self.sq_error_sum)
        return None if mse is None else math.sqrt(mse)

    @property
    def bucket_error(self) -> float | None:
        return bucket_error_from_histograms(self.pos, self.neg)

    def _mean(self, total: float) -> float | None:
        return total / self.examples if self.examples else None

    def summary(self) -> dict[str, float]:
        """Every *defined* derived metric by name (for logs, status and Prometheus gauges).

        Undefined metrics are left out rather than given a placeholder, so a consumer that
        copies this dict (the pass record, the export manifest, the gauges) cannot publish
        a number that was never measured; ``examples`` is always there (0 marks an empty
        pass).
        """
        out = {"examples": float(self.examples)}
        for name in DERIVED_METRICS:
            value: float | None = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    # --- wire form ---------------------------------------------------------------------

    def to_proto(self, day: str = "", pass_index: int = 0, generation: int = 0) -> Any:
        """A ``worker_pb2.PassResult`` carrying these sums (histograms as uint64 LE)."""
        return worker_pb2.PassResult(
            day=day,
            pass_index=pass_index,
            generation=generation,
            examples=self.examples,
            bad_lines=self.bad_lines,
            loss_sum=self.loss_sum,
            label_sum=self.label_sum,
            pred_sum=self.pred_sum,
            abs_error_sum=self.abs_error_sum,
            sq_error_sum=self.sq_error_sum,
            pos_buckets=_u64_bytes(self.pos),
            neg_buckets=_u64_bytes(self.neg),
            num_buckets=self.num_buckets,
            seconds=self.seconds,
            train_seconds=self.train_seconds,
            files_read=self.files_read,
            files_read_ahead=self.files_read_ahead,
        )

    @classmethod
    def from_proto(cls, msg: Any) -> PassMetrics:
        """Inverse of ``to_proto``; raises ``ValueError`` on inconsistent histograms."""
        n = int(msg.num_buckets)
        if n <= 0:
            raise ValueError(f"num_buckets must be positive, got {n}")
        return cls(
            num_buckets=n,
            pos=_u64_from_bytes(msg.pos_buckets, n, "pos_buckets"),
            neg=_u64_from_bytes(msg.neg_buckets, n, "neg_buckets"),
            examples=int(msg.examples),
            bad_lines=int(msg.bad_lines),
            files_read=int(msg.files_read),
            files_read_ahead=int(msg.files_read_ahead),
            loss_sum=float(msg.loss_sum),
            label_sum=float(msg.label_sum),
            pred_sum=float(msg.pred_sum),
            abs_error_sum=float(msg.abs_error_sum),
            sq_error_sum=float(msg.sq_error_sum),
            seconds=float(msg.seconds),
            train_seconds=float(msg.train_seconds),
        )
