"""The context's counted click rate (``models.context_rate``): a slot constant within its
training batches (an hour of day) offsets the logit by its key's PS-counted rate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.models.context_rate import (
    CONTEXT_BATCH_DECAY,
    CONTEXT_PRIOR_BATCHES,
    CONTEXT_PRIOR_EXAMPLES,
    ContextRate,
)
from streamtrain_worker.models.summary import drain_pending
from streamtrain_worker.publishing.export import export_dense, load_dense
from streamtrain_worker.training.train import Trainer

from .conftest import hour_stream

BASE = torch.tensor(0.2)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _pooled(shows: list[float], clicks: list[float], rows: int = 4, width: int = 3) -> torch.Tensor:
    """``(rows, S, width)`` pooled slots whose CVM columns hold ``shows`` and ``clicks`` per
    slot, the same in every row, the other columns distinct per row."""
    s = len(shows)
    pooled = torch.arange(rows * s * width, dtype=torch.float32).view(rows, s, width) / 100
    for slot, (show, click) in enumerate(zip(shows, clicks, strict=True)):
        pooled[:, slot, 0] = math.log1p(show)
        pooled[:, slot, 1] = math.log1p(click) - math.log1p(show)
    return pooled


def _trained(layer: ContextRate, pooled: torch.Tensor, keys: torch.Tensor | None = None) -> None:
    """A training batch as the trainer gives it: followed (``keys`` its first example's,
    0 in every slot unless given), then observed."""
    layer.follow_keys(
        pooled, torch.zeros(pooled.shape[1], dtype=torch.int64) if keys is None else keys
    )
    layer.observe()


def _context_of(layer: ContextRate, pooled: torch.Tensor, constant: int, batches: int) -> None:
    """Train on ``batches`` batches in which only slot ``constant`` is the same in every row."""
    for _ in range(batches):
        batch = pooled.clone()
        batch[:, constant] = batch[0, constant]
        _trained(layer, batch)


def test_a_fresh_layer_knows_no_context_and_offsets_nothing() -> None:
    layer = ContextRate(3).eval()
    logits = torch.tensor([0.5, -1.0, 2.0, 0.0])
    torch.testing.assert_close(layer(logits, _pooled([4000, 10, 0], [2000, 1, 0]), BASE), logits)


def test_a_slot_constant_in_its_batches_offsets_by_its_keys_shrunk_rate() -> None:
    layer = ContextRate(3)
    pooled = _pooled([4000, 10, 0], [2000, 1, 0])
    # one constant batch more than the prior's: slot 1 is a context, the others are not
    _context_of(layer, pooled, constant=1, batches=int(CONTEXT_PRIOR_BATCHES) + 1)
    assert layer.contexts().tolist() == [0.0, 1.0, 0.0]
    layer.eval()  # scored as an export is: the PS's counts as pulled
    shrunk = (1 + CONTEXT_PRIOR_EXAMPLES * 0.2) / (10 + CONTEXT_PRIOR_EXAMPLES)
    logits = torch.zeros(4)
    torch.testing.assert_close(
        layer(logits, pooled, BASE), torch.full((4,), _logit(shrunk) - _logit(0.2))
    )
    # the counts are pushed as a summary: [batches, constant per slot]
    torch.testing.assert_close(drain_pending([layer]), torch.tensor([5.0, 0.0, 5.0, 0.0]))


def test_an_unseen_context_key_predicts_the_base_rate() -> None:
    layer = ContextRate(2).eval()
    _context_of(layer, _pooled([0, 0], [0, 0]), constant=0, batches=20)
    torch.testing.assert_close(layer(torch.ones(4), _pooled([0, 50], [0, 40]), BASE), torch.ones(4))


def test_of_two_contexts_the_largest_offset_counts_not_their_sum() -> None:
    """An hour and a date describe one slice: counting both would count its rate twice."""
    layer = ContextRate(2)
    pooled = _pooled([4000, 90_000], [2000, 19_000])
    pooled[:] = pooled[0]  # both slots the same row in every example
    for _ in range(10):
        _trained(layer, pooled)
    assert layer.contexts().tolist() == [1.0, 1.0]
    layer.eval()
    hour = (2000 + CONTEXT_PRIOR_EXAMPLES * 0.2) / (4000 + CONTEXT_PRIOR_EXAMPLES)
    torch.testing.assert_close(
        layer(torch.zeros(4), pooled, BASE), torch.full((4,), _logit(hour) - _logit(0.2))
    )


def test_in_training_a_context_is_offset_by_its_counts_from_before_the_pass() -> None:
    """In training a pass's context key is scored by the counts pulled when the pass first
    met it (none of the pass's own pushes); another key, a new pass, or scoring outside
    training use the counts as pulled."""
    layer = ContextRate(2)
    keys = torch.tensor([7, 0])
    first = _pooled([1000, 0], [100, 0])
    first[:, 0] = first[0, 0]
    _context_of(layer, first, constant=0, batches=10)
    _trained(layer, first, keys)
    later = _pooled([1020, 0], [110, 0])  # the PS's counts, the pass's pushes included
    later[:, 0] = later[0, 0]
    rate = float(BASE)
    before = (100 + CONTEXT_PRIOR_EXAMPLES * rate) / (1000 + CONTEXT_PRIOR_EXAMPLES)
    live = (110 + CONTEXT_PRIOR_EXAMPLES * rate) / (1020 + CONTEXT_PRIOR_EXAMPLES)

    def offset(key: int) -> torch.Tensor:
        layer.follow_keys(later, torch.tensor([key, 0]))
        out = layer(torch.zeros(4), later, BASE)
        layer.observe()
        return out

    torch.testing.assert_close(offset(7), torch.full((4,), _logit(before) - _logit(rate)))
    # another key in the slot anchors at its own counts as pulled now
    torch.testing.assert_close(offset(8), torch.full((4,), _logit(live) - _logit(rate)))
    layer.begin_pass()
    torch.testing.assert_close(offset(7), torch.full((4,), _logit(live) - _logit(rate)))
    layer.eval()
    torch.testing.assert_close(
        layer(torch.zeros(4), later, BASE), torch.full((4,), _logit(live) - _logit(rate))
    )
    # a batch that was not followed (a scoring path that gives no keys) uses the pulled
    # counts, not another batch's anchors
    layer.train()
    torch.testing.assert_close(
        layer(torch.zeros(4), later, BASE), torch.full((4,), _logit(live) - _logit(rate))
    )


def test_a_batch_of_one_row_is_not_evidence_of_a_context() -> None:
    layer = ContextRate(2)
    for _ in range(50):
        _trained(layer, _pooled([10, 10], [1, 1], rows=1))
    assert layer.contexts().tolist() == [0.0, 0.0]
    prior = CONTEXT_PRIOR_BATCHES * CONTEXT_BATCH_DECAY**50
    torch.testing.assert_close(layer.stats, torch.tensor([prior, 0.0, 0.0]))


@given(
    st.floats(min_value=0.0, max_value=88.0, allow_nan=False),
    st.floats(min_value=-88.0, max_value=88.0, allow_nan=False),
    st.floats(min_value=1e-6, max_value=1 - 1e-6, allow_nan=False),
)
def test_counts_of_any_finite_size_give_a_finite_offset(
    log_show: float, log_ratio: float, rate: float
) -> None:
    """CVM columns of any finite count (clicks above shows included, as a corrupt or
    decayed row may hold) give a finite logit within the clamped rates' log-odds."""
    layer = ContextRate(1)  # in training, anchored at the counts as well
    pooled = torch.zeros(2, 1, 3)
    pooled[:, 0, 0] = log_show
    pooled[:, 0, 1] = log_ratio
    for _ in range(10):
        _trained(layer, pooled)
    layer.follow_keys(pooled, torch.tensor([3]))
    out = layer(torch.zeros(2), pooled, torch.tensor(rate, dtype=torch.float32))
    assert torch.isfinite(out).all()
    assert float(out.abs().max()) <= 2 * abs(_logit(1e-6)) + 1e-3


def _config(context_rate: bool = True) -> WorkerConfig:
    return WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4},
            "model": {"hiddenUnits": [16], "contextRate": context_rate},
            "runtime": {"overlap": False},
            "ps": {"config": {"logicalShards": 2}},
        }
    )


def _mean_prediction(trainer: Trainer, batch: Batch) -> float:
    return float(trainer.step(trainer.prepare(batch), train=False).preds.mean())


def test_a_model_after_one_hour_predicts_the_next_hour_at_its_counted_rate() -> None:
    """Hours 0 (5 %) and 1 (35 %) in turn, a pass each, for a day; on day 2, the model
    after hour 0 scores hour 1 near 35 % (its key counted yesterday's rate), where without
    the context rate it scores near the rate of the pass it just trained on."""
    predicted = {}
    for context_rate in (False, True):
        cfg = _config(context_rate)
        trainer = Trainer(cfg, LocalPS(cfg.ps.config), 4)
        try:
            for hour, rate in ((0, 0.05), (1, 0.35)):
                trainer.run_pass(hour_stream(hour, hour, rate))
            trainer.run_pass(hour_stream(10, 0, 0.05))
            trainer.model.eval()
            predicted[context_rate] = _mean_prediction(trainer, hour_stream(99, 1, 0.35, 1)[0])
        finally:
            trainer.close()
    assert predicted[False] < 0.2, predicted
    # what the hour key learned on day 1, before its offset was there, stays out of the
    # network (a context's row is not its input), so the rate is not counted twice: a
    # network that saw the row scored 0.46 here
    assert abs(predicted[True] - 0.35) < 0.05, predicted
    assert abs(predicted[True] - 0.35) < 0.5 * abs(predicted[False] - 0.35), predicted


def test_the_export_applies_the_contexts_training_found(tmp_path: Path) -> None:
    cfg = _config()
    trainer = Trainer(cfg, LocalPS(cfg.ps.config), 4)
    try:
        trainer.run_pass(hour_stream(0, 0, 0.3))
        model = trainer.model
        (context,) = model.context_rate
        assert isinstance(context, ContextRate)
        assert context.contexts().tolist() == [1.0, 0.0, 0.0, 0.0]
        export_dense(model, "slot_dnn", str(tmp_path / "m"))
        module, _ = load_dense(str(tmp_path / "m"))
        buffers = dict(module.named_buffers())
        torch.testing.assert_close(buffers["model.context_rate.0.stats"], context.stats)
        # a request of one row is constant in every slot; the export still offsets by the
        # contexts of training alone
        pooled = torch.randn(1, 4, trainer.spec.slot_width)
        pooled[:, :, 0] = math.log1p(1000.0)
        pooled[:, :, 1] = math.log1p(300.0) - math.log1p(1000.0)
        model.eval()
        torch.testing.assert_close(module(pooled), torch.sigmoid(model(pooled)))
        # the context slot's key unseen (no counts): no offset, and the network, which
        # does not see a context slot's row, scores the same
        unseen = pooled.clone()
        unseen[:, 0, :2] = 0.0
        with torch.no_grad():
            offset = model(pooled) - model(unseen)
        rate = model.base_rate[0].clamped_rate()
        shrunk = (300 + CONTEXT_PRIOR_EXAMPLES * float(rate)) / (1000 + CONTEXT_PRIOR_EXAMPLES)
        assert float(offset) == pytest.approx(_logit(shrunk) - _logit(float(rate)), abs=1e-4)
    finally:
        trainer.close()


def test_the_setting_off_builds_no_context_rate() -> None:
    cfg = _config(context_rate=False)
    trainer = Trainer(cfg, LocalPS(cfg.ps.config), 4)
    try:
        assert len(trainer.model.context_rate) == 0
        trainer.run_pass(hour_stream(0, 0, 0.3, batches=2))
        assert np.isfinite(trainer.model.base_rate[0].rate())
    finally:
        trainer.close()


def test_a_batchs_first_example_keys_name_each_slot_and_an_empty_bag() -> None:
    keys = np.array([5, 1 << 63, 9, 4], dtype=np.uint64)
    # example 0: slot 0 [5], slot 1 empty, slot 2 [2**63, 9]; example 1: [4], [], []
    offsets = np.array([0, 1, 1, 3, 4, 4, 4], dtype=np.int64)
    batch = Batch(np.zeros(2, dtype=np.float32), keys, offsets, num_slots=3)
    assert batch.first_example_keys().tolist() == [5, -1, -(1 << 63)]


def test_a_batch_of_two_rows_is_evidence_and_a_slot_at_the_share_is_a_context() -> None:
    """The edges: two rows can disagree, so two equal rows count; a slot constant in
    exactly the share of the batches is a context, one below it is not."""
    layer = ContextRate(3)
    batches = 16
    for i in range(batches):
        pooled = _pooled([10, 10, 10], [1, 1, 1], rows=2)
        pooled[1] = pooled[0]  # every slot the same in both rows ...
        if i % 2:  # slot 0 constant in every other batch: exactly half of them
            pooled[1, 0] = pooled[0, 0] + 1.0
        if i % 4:  # ... slot 1 in one batch of four
            pooled[1, 1] = pooled[0, 1] + 1.0
        _trained(layer, pooled)
    counted = CONTEXT_PRIOR_BATCHES * CONTEXT_BATCH_DECAY**batches
    counted += sum(CONTEXT_BATCH_DECAY**i for i in range(batches))
    # the exact decayed counts of the batches (each decays the earlier ones, then adds)
    assert float(layer.stats[0]) == pytest.approx(counted, rel=1e-6)
    assert float(layer.stats[3]) == pytest.approx(
        counted - CONTEXT_PRIOR_BATCHES * CONTEXT_BATCH_DECAY**batches, rel=1e-6
    )
    layer.stats[1] = 0.5 * layer.stats[0]  # at the share exactly
    assert layer.contexts().tolist() == [1.0, 0.0, 1.0]


def test_a_checkpoint_holds_the_counts_not_a_passs_anchors() -> None:
    """The anchors are the pass in hand's (``begin_pass`` forgets them): a checkpoint or a
    restore that carried them would score a replayed pass by another pass's counts."""
    layer = ContextRate(2)
    _trained(layer, _pooled([100, 0], [10, 0]), torch.tensor([3, 0]))
    assert set(layer.state_dict()) == {"stats"}


def test_scored_outside_training_each_row_is_offset_by_its_own_context_key() -> None:
    """A serving batch mixes hours: each row's offset is its own key's counted rate, and
    a key with shows but no clicks counts its zero."""
    layer = ContextRate(2)
    pooled = _pooled([0, 0], [0, 0])
    _context_of(layer, pooled, constant=0, batches=10)
    layer.eval()
    mixed = _pooled([0, 0], [0, 0], rows=3)
    for row, (shows, clicks) in enumerate([(4000.0, 2000.0), (900.0, 0.0), (0.0, 0.0)]):
        mixed[row, 0, 0] = math.log1p(shows)
        mixed[row, 0, 1] = math.log1p(clicks) - math.log1p(shows)
    rate = float(BASE)

    def expected(shows: float, clicks: float) -> float:
        shrunk = (clicks + CONTEXT_PRIOR_EXAMPLES * rate) / (shows + CONTEXT_PRIOR_EXAMPLES)
        return _logit(shrunk) - _logit(rate)

    torch.testing.assert_close(
        layer(torch.zeros(3), mixed, BASE),
        torch.tensor([expected(4000, 2000), expected(900, 0), 0.0]),
    )


def test_a_batch_not_followed_or_scored_outside_training_uses_the_pulled_counts() -> None:
    """Only the batch ``follow_keys`` was given, in training, is scored by the anchors;
    a batch not followed (a scoring path that gives no keys), one scored in eval between
    ``follow_keys`` and ``observe``, and a context slot that is not constant in the batch
    (a batch across two hours' folders) use each row's counts as pulled."""
    layer = ContextRate(1)
    anchored = _pooled([1000], [100])
    anchored[:] = anchored[0]  # the context slot the same in every row
    _context_of(layer, anchored, constant=0, batches=10)
    layer.begin_pass()
    layer.follow_keys(anchored, torch.tensor([7]))
    live = _pooled([1050], [130])
    live[:] = live[0]
    rate = float(BASE)
    shrunk = (130 + CONTEXT_PRIOR_EXAMPLES * rate) / (1050 + CONTEXT_PRIOR_EXAMPLES)
    pulled = torch.full((4,), _logit(shrunk) - _logit(rate))
    layer.eval()
    torch.testing.assert_close(layer(torch.zeros(4), live, BASE), pulled)
    layer.train()
    anchors = _logit(
        (100 + CONTEXT_PRIOR_EXAMPLES * rate) / (1000 + CONTEXT_PRIOR_EXAMPLES)
    ) - _logit(rate)
    torch.testing.assert_close(layer(torch.zeros(4), live, BASE), torch.full((4,), anchors))
    layer.observe()
    torch.testing.assert_close(layer(torch.zeros(4), live, BASE), pulled)
    # followed, but the slot differs between rows: no anchor for it in this batch
    across = live.clone()
    across[2:, 0, 2] += 1.0  # the later rows another key (same counts, another row)
    layer.follow_keys(across, torch.tensor([7]))
    torch.testing.assert_close(layer(torch.zeros(4), across, BASE), pulled)
