"""The base-rate offset (``models.base_rate``): every model's logit starts from the
log-odds of the click rate trained on so far, counted like the data norm's statistics."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.models.base_rate import (
    MAX_RATE_STEP_SCALE,
    RATE_FLOOR,
    BaseRate,
    rate_step_scale,
)
from streamtrain_worker.models.summary import drain_pending, gather_stats, summary_layers
from streamtrain_worker.training.train import Trainer

from .conftest import uniform_stream

CLICK_RATE = 0.02


def test_the_offset_is_the_log_odds_of_the_labels_counted_so_far() -> None:
    offset = BaseRate()
    logits = torch.tensor([0.0, 1.5])
    # one pseudo-example of label 0.5: no offset before any data
    torch.testing.assert_close(offset(logits), logits)
    offset.observe(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    rate = (0.5 + 1.0) / (1.0 + 4.0)
    torch.testing.assert_close(offset(logits), logits + math.log(rate / (1 - rate)))
    # the batch is pending for the PS push and already in the local sums
    torch.testing.assert_close(drain_pending([offset]), torch.tensor([4.0, 1.0]))
    torch.testing.assert_close(offset.stats, torch.tensor([5.0, 1.5]))


def test_a_stream_of_one_label_keeps_a_finite_logit() -> None:
    offset = BaseRate()
    offset.observe(torch.zeros(10_000_000))
    assert torch.isfinite(offset(torch.zeros(3))).all()


@given(
    st.floats(min_value=1.0, max_value=3e38, allow_nan=False),
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)
def test_counts_of_any_finite_size_give_a_finite_logit_and_a_clamped_rate(
    examples: float, share: float
) -> None:
    """Counts past float32's integers (where clicks / examples rounds to exactly 0 or 1,
    a stream of one label over a long run) or restored from any checkpoint."""
    offset = BaseRate()
    offset.stats = torch.tensor([examples, examples * share], dtype=torch.float32)
    assert torch.isfinite(offset(torch.zeros(2))).all()
    assert RATE_FLOOR * (1 - 1e-6) <= offset.rate() <= 1.0 - RATE_FLOOR * (1 - 1e-6)


def test_batches_observed_between_two_pushes_are_all_pending() -> None:
    offset = BaseRate()
    offset.observe(torch.tensor([1.0, 0.0]))
    offset.observe(torch.tensor([1.0, 1.0, 0.0]))
    torch.testing.assert_close(drain_pending([offset]), torch.tensor([5.0, 3.0]))


def _spec(base_rate: bool) -> ModelSpec:
    return ModelSpec(num_slots=3, embedding_dim=4, cvm=True, hidden_units=(8,), base_rate=base_rate)


@pytest.mark.parametrize("model_type", ["slot_dnn", "deepfm", "wide_deep"])
def test_every_model_adds_the_offset_to_its_logit(model_type: str) -> None:
    pooled = torch.randn(5, 3, _spec(True).slot_width)
    plain = build_model(model_type, _spec(False)).eval()
    offset = build_model(model_type, _spec(True)).eval()
    (rate,) = summary_layers(offset)[:1]
    assert isinstance(rate, BaseRate)
    rate.observe(torch.tensor([1.0] + [0.0] * 8))  # rate 0.15
    # the network reads the CVM click columns with a pseudo-show at that rate, too
    expected = plain(rate.smoothed_click_columns(pooled)) + math.log(0.15 / 0.85)
    torch.testing.assert_close(offset(pooled), expected)


def _stream(seed: int, batches: int, size: int = 200) -> list[Batch]:
    return uniform_stream(seed, batches, CLICK_RATE, size)


def _config(base_rate: bool) -> WorkerConfig:
    return WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4},
            # The calibration window would correct the offset's absence too.
            "model": {
                "hiddenUnits": [16],
                "baseRateOffset": base_rate,
                "residualCalibration": False,
            },
            "runtime": {"overlap": False},
            "ps": {"config": {"logicalShards": 2}},
        }
    )


@pytest.mark.parametrize("base_rate", [True, False])
def test_a_fresh_model_is_calibrated_from_its_first_pass(base_rate: bool) -> None:
    """Without the offset a fresh model predicts ~0.5 for every id it has not seen, and
    its output bias takes thousands of steps to reach a 2 % rate's log-odds."""
    cfg = _config(base_rate)
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, num_slots=4)
    try:
        trainer.run_pass(_stream(0, 30))
        second = trainer.run_pass(_stream(1, 30))
    finally:
        trainer.close()
    if base_rate:
        assert 0.7 < second.copc < 1.4, second.copc
        summary = gather_stats(summary_layers(trainer.model)).numpy()
        np.testing.assert_allclose(summary[0], 1.0 + 2 * 30 * 200, rtol=1e-4)  # decay aside
        np.testing.assert_array_equal(ps.pull_dense(cfg.summary_name)[:2], summary[:2])
    else:
        assert second.copc < 0.3, second.copc


def test_a_summary_vector_written_without_the_offset_is_refused_naming_the_setting() -> None:
    """What resuming a checkpoint from before the offset meets: a clear error, not a
    silently shifted statistics layout."""
    old = _config(base_rate=False)
    ps = LocalPS(old.ps.config)
    Trainer(old, ps, num_slots=4).close()
    with pytest.raises(ValueError, match=r"model\.baseRateOffset"):
        Trainer(_config(base_rate=True), ps, num_slots=4)


def test_a_fresh_model_starts_from_the_prior_click_rate_not_one_half() -> None:
    cfg = WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4},
            "model": {"hiddenUnits": [16], "priorClickRate": 0.04},
            "runtime": {"overlap": False},
            "ps": {"config": {"logicalShards": 2}},
        }
    )
    trainer = Trainer(cfg, LocalPS(cfg.ps.config), num_slots=4)
    try:
        first = trainer.run_pass(_stream(0, 1))
    finally:
        trainer.close()
    # The first batch is scored before anything was learned: at about the prior.
    assert 0.02 < first.predicted_ctr < 0.08, first.predicted_ctr


def test_the_rate_step_scale_is_the_label_noise_ratio_within_its_bounds() -> None:
    assert rate_step_scale(0.2) == pytest.approx(1.0)
    assert rate_step_scale(0.035) == pytest.approx(math.sqrt(0.16 / (0.035 * 0.965)))
    assert rate_step_scale(0.5) == 1.0  # a higher rate keeps the steps
    assert rate_step_scale(0.001) == MAX_RATE_STEP_SCALE
    assert rate_step_scale(0.0) == rate_step_scale(1.0) == MAX_RATE_STEP_SCALE
    for hostile in (math.nan, math.inf, -math.inf):  # a corrupt count scales nothing
        assert rate_step_scale(hostile) == 1.0
    assert rate_step_scale(-1e308) == rate_step_scale(1e308) == MAX_RATE_STEP_SCALE


@given(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)
def test_the_rate_step_scale_grows_as_the_rate_leaves_one_half(a: float, b: float) -> None:
    """Bounded for any rate, the same for r and 1 - r (the label's noise is), and larger
    the further the rate is from 1/2."""
    sa, sb = rate_step_scale(a), rate_step_scale(b)
    assert 1.0 <= sa <= MAX_RATE_STEP_SCALE
    assert rate_step_scale(1.0 - a) == pytest.approx(sa)
    if abs(a - 0.5) <= abs(b - 0.5):
        assert sa <= sb * (1 + 1e-12)


class _RecordingPS(LocalPS):
    """A LocalPS that keeps every sparse push it applies."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pushes: list[SparsePush] = []

    def push_sparse(self, table: str, push: SparsePush) -> None:
        self.pushes.append(push)
        super().push_sparse(table, push)


def test_a_low_click_rate_scales_the_embed_parts_pushed_gradients_only() -> None:
    """The same first batch at a 2 % rate with and without ``model.rateScaledSteps``:
    embed_w's gradients differ by the scale of the rate counted when the batch is pushed
    (the prior's pseudo-example and the batch), embedx's are the same."""
    pushes = {}
    for scaled in (True, False):
        cfg = _config(base_rate=True)
        cfg = replace(cfg, model=replace(cfg.model, rateScaledSteps=scaled))
        ps = _RecordingPS(cfg.ps.config)
        trainer = Trainer(cfg, ps, num_slots=4)
        try:
            trainer.run_pass(_stream(0, 1))
        finally:
            trainer.close()
        pushes[scaled] = ps.pushes[0]
    batch = _stream(0, 1)[0]
    prior = cfg.model.priorClickRate
    rate = (prior + float(batch.labels.sum())) / (1.0 + batch.size)
    scale = rate_step_scale(rate)
    assert scale > 2.0  # a 2 % stream
    on, off = pushes[True], pushes[False]
    np.testing.assert_array_equal(on.keys, off.keys)
    assert np.any(off.grads[:, 0] != 0)
    np.testing.assert_allclose(on.grads[:, 0], off.grads[:, 0] * scale, rtol=1e-5)
    np.testing.assert_array_equal(on.grads[:, 1:], off.grads[:, 1:])


@settings(deadline=None)  # a loaded machine's first torch call can take a second
@given(
    st.floats(min_value=0.0, max_value=1e30, allow_nan=False),
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    st.floats(min_value=1e-4, max_value=0.9, allow_nan=False),
)
def test_the_click_column_counts_one_pseudo_show_at_the_base_rate(
    shows: float, share: float, rate: float
) -> None:
    """``log(C + 1) - log(S + 1)`` (Paddle's CVM: one pseudo-show that clicked, so a key
    never shown reads as a 100 % click rate) becomes ``log(C + r) - log(S + 1)``; the show
    column and the embedding columns reach the network as they were, with their gradient."""
    offset = BaseRate()
    offset.stats = torch.tensor([1e6, 1e6 * rate])
    clicks = shows * share
    pooled = torch.tensor(
        [[[math.log1p(shows), math.log1p(clicks) - math.log1p(shows), 0.5, -2.0]]]
    ).requires_grad_(True)
    out = offset.smoothed_click_columns(pooled)
    r = offset.rate()
    expected = math.log(clicks + r) - math.log1p(shows)
    click_column = float(out.detach()[0, 0, 1])
    assert math.isfinite(click_column)
    assert click_column == pytest.approx(expected, rel=1e-4, abs=1e-4)
    torch.testing.assert_close(out[0, 0, [0, 2, 3]], pooled[0, 0, [0, 2, 3]])
    out[0, 0, 2:].sum().backward()
    assert pooled.grad is not None
    torch.testing.assert_close(pooled.grad[0, 0], torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_a_key_never_shown_reads_the_base_rate_not_a_certain_click() -> None:
    offset = BaseRate()
    offset.stats = torch.tensor([1000.0, 35.0])
    never = torch.zeros(1, 1, 3)
    assert float(offset.smoothed_click_columns(never)[0, 0, 1]) == pytest.approx(math.log(0.035))


@settings(deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)
def test_any_finite_cvm_columns_stay_finite(
    shows_log: float, click_column: float, rate: float
) -> None:
    """A restored or hostile count (negative, past float32's integers: the two columns'
    sum overflows) and a base rate of exactly 0 or 1 (clamped) still give the network
    finite inputs, the show column as it was."""
    offset = BaseRate()
    offset.stats = torch.tensor([1.0, rate])
    out = offset.smoothed_click_columns(torch.tensor([[[shows_log, click_column, 1.0]]]))
    assert torch.isfinite(out).all()
    assert float(out[0, 0, 0]) == shows_log
