"""The calibration's formulas (``models.calibration``) against closed forms worked here in
float64 from their docstrings, at the edges the stream tests never reach.

Why: ``test_calibration.py`` drives the layer over simulated streams (a rate jump is
followed, a stationary stream's noise is shrunk), whose tolerances let a wrong constant or
a swapped sum through. A mutation run over the module (``make test-mutants``) left such
changes alive: the clicks' variance taken on the predictions, the pass split's gap with the
wrong sign or against the window's sums plus the pass's, a decay of one accepted, a window
of one example refused, a zero gap weighted 1e12. Each formula is pinned here where the
counts are small enough to work by hand, fractional (decayed) or empty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamtrain_worker.models.calibration import (
    RateMovement,
    ResidualCalibration,
    _beyond,
    click_log_odds_variance,
    log_odds_noise,
    window_decay,
    window_noise,
)


def _sums(examples: float, clicks: float, predicted: float) -> torch.Tensor:
    return torch.tensor([examples, clicks, predicted])


# -- the window's decay ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "batch_size", "expected"),
    [
        (2.0, 1, 0.5),  # half of a two-example window goes with every example
        (4.0, 3, 27 / 64),  # (3/4) ** 3
        (1.5, 2, 1 / 9),  # (1/3) ** 2: a window between one and two examples
        (300.0, 64, (299 / 300) ** 64),
    ],
)
def test_the_decay_keeps_one_minus_one_over_the_window_per_example(
    window: float, batch_size: int, expected: float
) -> None:
    assert window_decay(window, batch_size) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("window", [1.0, 0.5, 1e-3])
def test_a_window_of_one_example_or_less_keeps_only_the_last_batch(window: float) -> None:
    """Decay 0, not ``(1 - 1/window) ** batch`` (of a negative base for a window below
    one), nor a refusal: and the layer takes that decay, its window the last batch."""
    assert window_decay(window, 64) == 0.0
    layer = ResidualCalibration(window_decay(window, 64), 0.5)
    layer.observe(torch.ones(4), layer(torch.zeros(4)))
    layer.observe(torch.tensor([1.0, 0.0]), layer(torch.zeros(2)))  # scored at 50 % raw
    torch.testing.assert_close(layer.stats, _sums(2.0, 1.0, 1.0))


@pytest.mark.parametrize("window", [0.0, -1.0])
def test_a_window_of_no_examples_is_refused_naming_the_setting(window: float) -> None:
    with pytest.raises(ValueError, match=r"model\.calibrationWindow: must be > 0"):
        window_decay(window, 64)


@pytest.mark.parametrize("decay", [1.0, 1.5, -0.1])
def test_a_decay_outside_zero_to_one_is_refused(decay: float) -> None:
    """A decay of 1 would never forget: the window would be all the data, the base rate's
    job."""
    with pytest.raises(ValueError, match=r"calibration window decay: must be in \[0, 1\)"):
        ResidualCalibration(decay, 0.5)


@pytest.mark.parametrize("pseudo_clicks", [0.0, -0.5])
def test_no_pseudo_clicks_is_refused_naming_the_setting(pseudo_clicks: float) -> None:
    """Without pseudo-clicks an empty window's log-odds are log(0 / 0)."""
    with pytest.raises(ValueError, match=r"model\.calibrationPseudoClicks: must be > 0"):
        ResidualCalibration(0.5, pseudo_clicks)


# -- the sampling variances -------------------------------------------------------------


@pytest.mark.parametrize(
    ("sums", "k", "expected"),
    [
        # 5 clicks of 20 (8 predicted: not in the formula), half a pseudo-click
        ((20.0, 5.0, 8.0), 0.5, 1 / 5.5 + 1 / 15.5),
        ((20.0, 5.0, 1.0), 0.5, 1 / 5.5 + 1 / 15.5),
        # no clicks at all: the pseudo-click alone on that side
        ((100.0, 0.0, 30.0), 2.0, 1 / 2.0 + 1 / 102.0),
        # decayed, fractional counts
        ((2.5, 1.25, 0.0), 1.0, 1 / 2.25 + 1 / 2.25),
    ],
)
def test_the_click_log_odds_variance_is_woolfs(
    sums: tuple[float, float, float], k: float, expected: float
) -> None:
    """``1 / (clicks + k) + 1 / (non-clicks + k)``, the empirical log-odds' variance."""
    got = click_log_odds_variance(_sums(*sums), k)
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_the_variance_is_per_column() -> None:
    sums = torch.tensor([[20.0, 100.0], [5.0, 0.0], [8.0, 30.0]])
    expected = torch.tensor([1 / 5.5 + 1 / 15.5, 1 / 0.5 + 1 / 100.5])
    torch.testing.assert_close(click_log_odds_variance(sums, 0.5), expected)


def _delta_method(examples: float, clicks: float, k: float, decay: float, expected: float) -> float:
    """The click log-odds' variance where the count varies binomially about ``expected``:
    the slope of ``log((c + k) / (n - c + k))`` in ``c``, squared, times the count's
    variance ``expected (n - expected) / n`` (nothing where ``expected`` is outside
    ``[0, n]``, ``n`` at least one example), over ``1 + decay``."""
    slope = 1 / (clicks + k) + 1 / (examples - clicks + k)
    count_variance = max(0.0, expected * (examples - expected) / max(examples, 1.0))
    return slope * slope * count_variance / (1 + decay)


@pytest.mark.parametrize(
    ("sums", "k", "decay", "around"),
    [
        ((20.0, 5.0, 8.0), 0.5, 0.0, 8.0),  # the clicks about the predictions
        ((20.0, 5.0, 8.0), 0.5, 0.8, 5.0),  # about the clicks themselves
        ((300.0, 90.0, 45.0), 10.0, 0.95, 45.0),
        ((1.5, 0.5, 0.75), 0.5, 0.5, 0.75),  # a decayed window of one and a half examples
        ((0.5, 0.25, 0.25), 0.5, 0.0, 0.25),  # below one example: divided by one
    ],
)
def test_the_log_odds_noise_is_the_delta_method(
    sums: tuple[float, float, float], k: float, decay: float, around: float
) -> None:
    got = log_odds_noise(_sums(*sums), k, decay, torch.tensor(around))
    assert float(got) == pytest.approx(_delta_method(sums[0], sums[1], k, decay, around), rel=1e-5)


@pytest.mark.parametrize("around", [0.0, 20.0, 25.0, -3.0])
def test_a_count_that_cannot_vary_has_no_noise(around: float) -> None:
    """Expected clicks of none, all or more than all the examples (a lagging sum) leave
    the count nothing to vary by: no noise, not a floor."""
    assert float(log_odds_noise(_sums(20.0, 5.0, 8.0), 0.5, 0.5, torch.tensor(around))) == 0.0


def test_the_window_noise_is_about_the_windows_predictions() -> None:
    sums = _sums(40.0, 4.0, 12.0)
    expected = _delta_method(40.0, 4.0, 1.0, 0.9, 12.0)
    assert float(window_noise(sums, 1.0, 0.9)) == pytest.approx(expected, rel=1e-5)


# -- the positive-part weight -----------------------------------------------------------


@pytest.mark.parametrize(
    ("gap", "threshold", "expected"),
    [
        (2.0, 1.0, 0.75),  # 1 - 1/4
        (-2.0, 1.0, 0.75),  # either sign
        (3.0, 9.0, 0.0),  # exactly at the threshold
        (1.0, 4.0, 0.0),  # below it: none, not negative
        (0.0, 1.0, 0.0),  # no gap at all
        (1e-7, 1e-3, 0.0),
        (100.0, 0.0, 1.0),
    ],
)
def test_the_split_weight_is_the_positive_part_of_one_minus_threshold_over_gap_squared(
    gap: float, threshold: float, expected: float
) -> None:
    got = float(_beyond(torch.tensor(gap), torch.tensor(threshold)))
    assert got == pytest.approx(expected, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    gap=st.floats(-1e6, 1e6, width=32),
    threshold=st.floats(0.0, 1e6, width=32),
)
@example(gap=0.0, threshold=1.0)
def test_the_split_weight_is_a_share(gap: float, threshold: float) -> None:
    got = float(_beyond(torch.tensor(gap), torch.tensor(threshold)))
    assert 0.0 <= got <= 1.0


# -- the evidence's strength ------------------------------------------------------------


def _evidence_of(layer: ResidualCalibration) -> RateMovement:
    evidence = layer.evidence[0]
    assert isinstance(evidence, RateMovement)
    return evidence


def _evidence(log_odds: list[float], noises: list[float]) -> RateMovement:
    evidence = RateMovement()
    for x, v in zip(log_odds, noises, strict=True):
        evidence.record(torch.tensor(x), torch.tensor(v))
    return evidence


@pytest.mark.parametrize(
    ("log_odds", "noises", "noise"),
    [
        ([-2.0, -1.0, 0.5], [0.05, 0.05, 0.05], 0.5),
        ([-2.0, -1.0, 0.5, -0.5], [0.1, 0.2, 0.1, 0.2], 0.05),
        ([-1.0, -1.2], [0.01, 0.03], 2.0),
        ([-1.0, -1.02, -0.98], [0.5, 0.5, 0.5], 0.1),  # all noise: no signal
    ],
)
def test_the_strength_is_the_between_pass_variance_share_behind_a_prior(
    log_odds: list[float], noises: list[float], noise: float
) -> None:
    """``tau2`` is the log-odds' variance over the passes (population, as ``statistics
    .pvariance``) less their mean sampling variance; ``P - 1`` passes of spread against
    ``EVIDENCE_PRIOR_PASSES`` (2) of weight on the whole correction."""
    passes = len(log_odds)
    mean = sum(log_odds) / passes
    variance = sum((x - mean) ** 2 for x in log_odds) / passes
    tau2 = max(0.0, variance - sum(noises) / passes)
    filled = (passes - 1) / (passes - 1 + 2)
    expected = filled * tau2 / (tau2 + noise) + (1 - filled)
    got = float(_evidence(log_odds, noises).strength(torch.tensor(noise)))
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    passes=st.integers(0, 10_000),
    stats=st.tuples(
        st.floats(-1e6, 1e6, width=32), st.floats(0.0, 1e6, width=32), st.floats(0.0, 1e6, width=32)
    ),
    noise=st.floats(0.0, 1e6, width=32),
)
@example(passes=2, stats=(0.0, 2.5e-12, 0.0), noise=0.0)  # a signal of about 1e-12
@example(passes=2, stats=(0.0, 2e-12, 0.0), noise=0.0)
def test_the_strength_stays_between_its_prior_share_and_one(
    passes: int, stats: tuple[float, float, float], noise: float
) -> None:
    """The evidence's own weight (``filled``) can only take away from the whole
    correction, never add to it nor turn it around, whatever the sums and however small
    the signal and the noise."""
    evidence = RateMovement()
    evidence.stats.copy_(torch.tensor([float(passes), *stats]))
    spreads = max(passes - 1, 0)
    filled = spreads / (spreads + 2)
    got = float(evidence.strength(torch.tensor(noise)))
    assert 1 - filled - 1e-6 <= got <= 1 + 1e-6


# -- the pass split ---------------------------------------------------------------------


def _log_odds(hits: float, total: float, k: float) -> float:
    return math.log((hits + k) / (total - hits + k))


def _residual(sums: Sequence[float], k: float) -> float:
    n, c, p = sums
    return _log_odds(c, n, k) - _log_odds(p, n, k)


def _split_correction(
    window: Sequence[float],
    own: Sequence[float],
    k: float,
    strength: float,
) -> float:
    """The module docstring's correction: the window's residual times the strength, moved
    toward the pass's own residual by the larger of the 1.5-standard-error weight (times
    the strength) and the 3-standard-error one, on the gap between the pass's residual and
    the earlier passes' (the window less the pass, clipped to sums a window can hold)."""
    n = max(window[0] - own[0], 0.0)
    earlier = (n, min(max(window[1] - own[1], 0.0), n), min(max(window[2] - own[2], 0.0), n))
    gap = _residual(own, k) - _residual(earlier, k)
    variance = 1 / (own[1] + k) + 1 / (own[0] - own[1] + k)

    def weight(significance: float) -> float:
        return max(0.0, 1 - significance * variance / (gap * gap)) if gap else 0.0

    keep = max(strength * weight(2.25), weight(9.0))
    shrunk = strength * _residual(window, k)
    return shrunk + keep * (_residual(own, k) - shrunk)


_SPLIT_CASES = [
    # a window of 5 % earlier passes (predicted at 5 %), a pass at 40 %: followed
    ((1000.0, 50.0 + 40.0, 50.0 + 5.0), (100.0, 40.0, 5.0)),
    # the same pass rate as the window's: the gap is noise, the window corrects
    ((1000.0, 100.0, 80.0), (100.0, 10.0, 8.0)),
    # a pass whose rate fell: the gap's other sign
    ((800.0, 300.0 + 5.0, 250.0 + 20.0), (60.0, 5.0, 20.0)),
    # the first pass: the window is all this pass's, no earlier part
    ((50.0, 20.0, 5.0), (50.0, 20.0, 5.0)),
    # earlier passes without a click, predicted at 10 %: the clicks' part clipped at 0
    ((500.0, 12.0, 45.0), (50.0, 12.0, 5.0)),
    # a window lagging the pass's sums (the PS's as of the last dense sync)
    ((355.2, 65.7, 69.6), (382.1, 68.7, 54.5)),
    # the earlier part with more clicks than examples left: clipped to its examples
    ((120.0, 100.0, 30.0), (100.0, 30.0, 25.0)),
    # a tiny pass (variance above 2): only a gap of many standard errors moves it
    ((400.0, 40.0, 40.0), (3.0, 3.0, 0.3)),
]


@pytest.mark.parametrize(("window", "own"), _SPLIT_CASES)
@pytest.mark.parametrize("k", [0.5, 10.0])
def test_the_pass_split_is_the_documented_weighting(
    window: tuple[float, float, float], own: tuple[float, float, float], k: float
) -> None:
    layer = ResidualCalibration(window_decay(300.0, 64), k, pass_split=True)
    layer.stats.copy_(_sums(*window))
    layer.pass_sums.copy_(_sums(*own))
    expected = _split_correction(window, own, k, strength=1.0)
    assert float(layer.offset()) == pytest.approx(expected, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize(("window", "own"), _SPLIT_CASES)
def test_a_weak_strength_scales_the_lenient_split_and_not_the_strict_one(
    window: tuple[float, float, float], own: tuple[float, float, float]
) -> None:
    """With the evidence at a small strength the 1.5-standard-error weight is scaled down
    and the 3-standard-error one (unscaled) is the larger where the gap is large."""
    k = 1.0
    layer = ResidualCalibration(window_decay(300.0, 64), k, pass_split=True, evidence=True)
    # ten passes of a stationary stream: the log-odds' spread is all sampling noise, so
    # the strength is the prior's share alone, 1 - 9 / (9 + 2)
    for x in [-2.0, -2.1, -1.9, -2.0, -2.05, -1.95, -2.0, -2.1, -1.9, -2.0]:
        _evidence_of(layer).record(torch.tensor(x), torch.tensor(0.5))
    layer.stats.copy_(_sums(*window))
    layer.pass_sums.copy_(_sums(*own))
    strength = float(layer.strength())
    assert strength == pytest.approx(2 / 11, rel=1e-5)
    expected = _split_correction(window, own, k, strength)
    assert float(layer.offset()) == pytest.approx(expected, rel=1e-4, abs=1e-4)


@settings(max_examples=150, deadline=None)
@given(
    window=st.tuples(st.floats(0.0, 5000.0), st.floats(0.0, 1.0), st.floats(0.001, 1.0)),
    own=st.tuples(st.floats(0.0, 2000.0), st.floats(0.0, 1.0), st.floats(0.001, 1.0)),
    k=st.sampled_from([0.5, 1.0, 10.0]),
)
def test_any_window_and_pass_sums_split_as_documented(
    window: tuple[float, float, float], own: tuple[float, float, float], k: float
) -> None:
    """Counts and shares drawn freely, the window lagging the pass or not."""
    window_sums = (window[0], window[0] * window[1], window[0] * window[2])
    own_sums = (own[0], own[0] * own[1], own[0] * own[2])
    layer = ResidualCalibration(window_decay(300.0, 64), k, pass_split=True)
    layer.stats.copy_(_sums(*window_sums))
    layer.pass_sums.copy_(_sums(*own_sums))
    # the reference from the float32 sums the layer holds
    expected = _split_correction(layer.stats.tolist(), layer.pass_sums.tolist(), k, 1.0)
    assert float(layer.offset()) == pytest.approx(expected, rel=2e-3, abs=2e-3)


# -- a layer whose window was loaded (a worker joining the PS) --------------------------


def _loaded(evidence: bool = False) -> ResidualCalibration:
    """A fresh layer holding a window of 300 examples, 90 clicks, 45 predicted, as a
    worker loads it from the PS at its first dense sync."""
    layer = ResidualCalibration(window_decay(300.0, 64), 10.0, evidence=evidence)
    layer.stats.copy_(_sums(300.0, 90.0, 45.0))
    return layer


def test_before_any_batch_the_batch_offset_is_the_windows_correction() -> None:
    """Nothing scored yet: ``batch_offset`` is the current correction, the window's
    residual log(100 / 220) - log(55 / 265) (10 pseudo-clicks), and a batch observed
    without per-example scoring adds its raw probabilities, the correction taken off."""
    layer = _loaded()
    expected = math.log(100 / 220) - math.log(55 / 265)
    assert float(layer.batch_offset()) == pytest.approx(expected, rel=1e-5)
    raw = torch.tensor([-1.0, 0.0, 2.0])
    layer.observe(torch.tensor([0.0, 1.0, 1.0]), layer(raw))
    decay = window_decay(300.0, 64)
    predicted = 45.0 * decay + float(torch.sigmoid(raw).sum())
    assert float(layer.stats[2]) == pytest.approx(predicted, rel=1e-5)


def test_the_evidence_counts_a_window_only_at_a_pass_start() -> None:
    """A loaded window is counted by the first batch after ``begin_pass``, not by a batch
    trained before any pass began."""
    layer = _loaded(evidence=True)
    layer.observe(torch.ones(8), layer(torch.zeros(8)))
    assert float(_evidence_of(layer).stats[0]) == 0.0
    layer.begin_pass()
    layer.observe(torch.ones(8), layer(torch.zeros(8)))
    assert float(_evidence_of(layer).stats[0]) == 1.0
