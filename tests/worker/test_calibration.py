"""The online residual calibration (``models.calibration``): a logit correction over a
recent window of trained examples, test then train, exported with the network."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.export import export_dense, load_dense
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.models.calibration import ResidualCalibration
from streamtrain_worker.train import Trainer


def test_an_empty_window_corrects_nothing_and_pseudo_clicks_shrink_the_correction() -> None:
    layer = ResidualCalibration(window=1e9, pseudo_clicks=5.0)
    logits = torch.tensor([-2.0, 0.5])
    torch.testing.assert_close(layer(logits), logits)
    # 10 clicks where the model predicted 0.5 * 20 = 10: nothing to correct
    layer.observe(torch.tensor([1.0, 0.0] * 10), torch.zeros(20))
    torch.testing.assert_close(layer(logits), logits)
    # 2 more clicks predicted at 0.5 each: 12 of 22 clicked, 11 predicted
    layer.observe(torch.ones(2), torch.zeros(2))
    expected = math.log((12 + 5) / (10 + 5)) - math.log((11 + 5) / (11 + 5))
    torch.testing.assert_close(layer(logits), logits + expected)


def test_a_rate_shift_is_corrected_within_a_few_batches() -> None:
    """A network stuck at the previous hour's 5 % while the stream moved to 40 %: a window
    of 256 examples brings the scored batches' mean prediction back to 40 % +- 6 points
    within eight batches of 64 (the window's clicks lag as its decay: ~8 % left)."""
    layer = ResidualCalibration(window=256.0, pseudo_clicks=1.0)
    rng = np.random.default_rng(0)
    raw = torch.full((64,), math.log(0.05 / 0.95))

    def scored_batch(rate: float) -> float:
        logits = layer(raw)  # scored first ...
        labels = torch.from_numpy((rng.random(64) < rate).astype(np.float32))
        layer.observe(labels, logits)  # ... then trained on
        return float(torch.sigmoid(logits).mean())

    for _ in range(20):
        assert 0.03 < scored_batch(0.05) < 0.08
    assert scored_batch(0.40) < 0.08  # the shift's first batch cannot know it
    means = [scored_batch(0.40) for _ in range(10)]
    assert means[0] < means[3] < means[7], means
    assert all(0.34 < m < 0.46 for m in means[7:]), means


def _config(calibration: bool) -> WorkerConfig:
    return WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4},
            "model": {
                "hiddenUnits": [16],
                "residualCalibration": calibration,
                "calibrationWindow": 400,
            },
            "runtime": {"overlap": False},
            "ps": {"config": {"logicalShards": 2}},
        }
    )


def _stream(seed: int, batches: int, rate: float, size: int = 100) -> list[Batch]:
    """Four slots of 1,000 ids each, clicks at ``rate`` regardless of the ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        keys = (rng.integers(0, 1000, (size, 4)) + np.arange(4) * 1000).astype(np.uint64)
        labels = (rng.random(size) < rate).astype(np.float32)
        offsets = np.arange(0, 4 * size + 1, dtype=np.int64)
        out.append(Batch(labels, keys.reshape(-1), offsets, num_slots=4))
    return out


@pytest.mark.parametrize("calibration", [True, False])
def test_a_pass_after_an_hourly_rate_jump_is_calibrated(calibration: bool) -> None:
    """Two passes at 5 %, then one at 35 %: the counted base rate and the learned bias lag
    behind (COPC well above 1); the calibration follows within the pass."""
    trainer = Trainer(_config(calibration), LocalPS(_config(calibration).ps.config), 4)
    try:
        trainer.run_pass(_stream(0, 20, 0.05))
        trainer.run_pass(_stream(1, 20, 0.05))
        jumped = trainer.run_pass(_stream(2, 20, 0.35))
    finally:
        trainer.close()
    if calibration:
        assert 0.85 < jumped.copc < 1.3, jumped.copc
    else:
        assert jumped.copc > 1.5, jumped.copc


def test_a_scored_batch_never_sees_its_own_labels() -> None:
    """Two trainers on the same stream, the last batch's labels flipped in one: its scores
    are the same (the window is updated only after scoring); the next batch's differ."""
    history = _stream(0, 5, 0.1)
    last, after = _stream(1, 2, 0.1)
    flipped = Batch(1.0 - last.labels, last.keys, last.offsets, num_slots=4)
    outputs = []
    for batch in (last, flipped):
        trainer = Trainer(_config(True), LocalPS(_config(True).ps.config), 4)
        try:
            for b in history:
                trainer.step(trainer.prepare(b), train=True)
            scored = trainer.step(trainer.prepare(batch), train=True).preds
            window = trainer.model.calibration[0].sums.clone()
            following = trainer.step(trainer.prepare(after), train=False).preds
        finally:
            trainer.close()
        outputs.append((scored, window, following))
    (scored_a, window_a, next_a), (scored_b, window_b, next_b) = outputs
    np.testing.assert_array_equal(scored_a, scored_b)
    assert window_a[1] != window_b[1]  # the labels did count, after scoring
    assert not np.allclose(next_a, next_b)


def test_the_export_and_a_snapshot_export_carry_the_correction(tmp_path: Path) -> None:
    cfg = _config(True)
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, 4)
    try:
        trainer.run_pass(_stream(0, 10, 0.3))
        ps.snapshot(SaveMode.DELTA, "pass-1")
        window = trainer.model.calibration[0].sums.clone()
        assert window[1] > 0
        for name, model in [
            ("live", trainer.model),
            ("snapshot", trainer.snapshot_model("pass-1")),
        ]:
            export_dense(model, "slot_dnn", str(tmp_path / name))
            module, _ = load_dense(str(tmp_path / name))
            buffers = dict(module.named_buffers())
            torch.testing.assert_close(buffers["model.calibration.0.sums"], window)
            pooled = torch.randn(3, 4, trainer.spec.slot_width)
            model.eval()
            torch.testing.assert_close(module(pooled), torch.sigmoid(model(pooled)))
    finally:
        trainer.close()


def test_the_setting_off_builds_no_calibration() -> None:
    spec = ModelSpec(num_slots=3, embedding_dim=4, cvm=True, hidden_units=(8,))
    assert len(build_model("slot_dnn", spec).calibration) == 0
    on = ModelSpec(num_slots=3, embedding_dim=4, cvm=True, hidden_units=(8,), calibration_window=50)
    assert len(build_model("slot_dnn", on).calibration) == 1
