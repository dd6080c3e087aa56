"""The online residual calibration (``models.calibration``): a logit correction over a
recent window of trained examples, test then train, held on the PS (checkpointed, shared by
the workers) and exported with the network."""

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
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.models.calibration import (
    CALIBRATION_VECTOR,
    ResidualCalibration,
    window_decay,
)
from streamtrain_worker.publishing.export import export_dense, load_dense
from streamtrain_worker.training.train import Trainer

from .conftest import uniform_stream


def test_an_empty_window_corrects_nothing_and_pseudo_clicks_shrink_the_correction() -> None:
    layer = ResidualCalibration(decay=1.0 - 1e-12, pseudo_clicks=5.0)
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
    layer = ResidualCalibration(window_decay(256.0, 64), pseudo_clicks=1.0)
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


def _corrections(layer: ResidualCalibration, rates: list[float], seed: int) -> list[float]:
    """The correction each batch of 64 was scored with, a network stuck at 5 %, the
    stream's click rate ``rates[i]`` in batch ``i``."""
    rng = np.random.default_rng(seed)
    raw = torch.full((64,), math.log(0.05 / 0.95))
    out = []
    for rate in rates:
        logits = layer(raw)
        out.append(float(logits[0] - raw[0]))
        labels = torch.from_numpy((rng.random(64) < rate).astype(np.float32))
        layer.observe(labels, logits)
    return out


def test_a_pass_follows_its_own_jump_and_a_steady_pass_keeps_the_window() -> None:
    """A network stuck at 5 %, a window full of 5 % batches, then a new pass at 40 %: split
    at the pass, the scored rate is past 30 % after three batches, where the window alone
    is still below 25 %. A new pass at the same 5 % is corrected as the window would (its
    gap to the earlier passes is noise). Outside training the window alone corrects."""
    decay = window_decay(300.0, 64)
    reached = {}
    for split in (False, True):
        layer = ResidualCalibration(decay, 1.0, pass_split=split)
        _corrections(layer, [0.05] * 40, seed=4)
        layer.begin_pass()
        after = _corrections(layer, [0.40] * 4, seed=5)
        reached[split] = 1.0 / (1.0 + 19.0 * math.exp(-after[3]))  # 5 % corrected
        layer.eval()
        window_only = ResidualCalibration(decay, 1.0)
        window_only.stats.copy_(layer.stats)
        torch.testing.assert_close(layer.offset(), window_only.offset())
    assert reached[False] < 0.25, reached
    assert 0.3 < reached[True] < 0.47, reached
    steady = []
    for split in (False, True):
        layer = ResidualCalibration(decay, 1.0, pass_split=split)
        _corrections(layer, [0.05] * 40, seed=6)
        layer.begin_pass()
        steady.append(_corrections(layer, [0.05] * 10, seed=7))
    assert np.max(np.abs(np.subtract(*steady))) < 0.1, steady


def _config(calibration: bool, window: float = 400, in_loss: bool = True) -> WorkerConfig:
    return WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4},
            "model": {
                "hiddenUnits": [16],
                "residualCalibration": calibration,
                "calibrationWindow": window,
                "calibrationInLoss": in_loss,
            },
            "runtime": {"overlap": False},
            "ps": {"config": {"logicalShards": 2}},
        }
    )


@pytest.mark.parametrize("calibration", [True, False])
def test_a_pass_after_an_hourly_rate_jump_is_calibrated(calibration: bool) -> None:
    """Two passes at 5 %, then one at 35 %: the counted base rate and the learned bias lag
    behind (COPC well above 1); the calibration follows within the pass."""
    trainer = Trainer(_config(calibration), LocalPS(_config(calibration).ps.config), 4)
    try:
        trainer.run_pass(uniform_stream(0, 20, 0.05))
        trainer.run_pass(uniform_stream(1, 20, 0.05))
        jumped = trainer.run_pass(uniform_stream(2, 20, 0.35))
        # the per-pass sums hold the last pass's 20 batches of 100 only, decayed per batch
        own = [float(c.pass_sums[0]) for c in trainer.model.calibration]
        decay = window_decay(400.0, 64)
    finally:
        trainer.close()
    if calibration:
        assert own == pytest.approx([100 * (1 - decay**20) / (1 - decay)], rel=1e-5), own
        assert 0.85 < jumped.copc < 1.3, jumped.copc
    else:
        assert jumped.copc > 1.5, jumped.copc


def test_trained_on_the_raw_logit_the_network_itself_learns_the_jump() -> None:
    """``calibrationInLoss: false``: the calibration still scores the jumped pass, but the
    network is trained on its own logit, so it learns the new rate that the window would
    otherwise absorb: its uncorrected prediction ends nearer 35 %."""
    own_rate = {}
    for in_loss in (True, False):
        cfg = _config(True, in_loss=in_loss)
        trainer = Trainer(cfg, LocalPS(cfg.ps.config), 4)
        try:
            trainer.run_pass(uniform_stream(0, 20, 0.05))
            jumped = trainer.run_pass(uniform_stream(2, 20, 0.35))
            probe = trainer.prepare(uniform_stream(3, 1, 0.35)[0])
            scored = trainer.step(probe, train=False).preds
            offset = float(trainer.model.calibration_offset())
        finally:
            trainer.close()
        assert 0.8 < jumped.copc < 1.35, (in_loss, jumped.copc)  # scored calibrated either way
        logits = np.log(scored / (1.0 - scored)) - offset
        own_rate[in_loss] = float((1.0 / (1.0 + np.exp(-logits))).mean())
    assert own_rate[True] < own_rate[False] < 0.45, own_rate
    assert own_rate[False] - own_rate[True] > 0.03, own_rate


def test_a_scored_batch_never_sees_its_own_labels() -> None:
    """Two trainers on the same stream, the last batch's labels flipped in one: its scores
    are the same (the window is updated only after scoring); the next batch's differ."""
    history = uniform_stream(0, 5, 0.1)
    last, after = uniform_stream(1, 2, 0.1)
    flipped = Batch(1.0 - last.labels, last.keys, last.offsets, num_slots=4)
    outputs = []
    for batch in (last, flipped):
        trainer = Trainer(_config(True), LocalPS(_config(True).ps.config), 4)
        try:
            for b in history:
                trainer.step(trainer.prepare(b), train=True)
            scored = trainer.step(trainer.prepare(batch), train=True).preds
            window = trainer.model.calibration[0].stats.clone()
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
        trainer.run_pass(uniform_stream(0, 10, 0.3))
        ps.snapshot(SaveMode.DELTA, "pass-1")
        window = trainer.model.calibration[0].stats.clone()
        assert window[1] > 0
        for name, model in [
            ("live", trainer.model),
            ("snapshot", trainer.snapshot_model("pass-1")),
        ]:
            export_dense(model, "slot_dnn", str(tmp_path / name))
            module, _ = load_dense(str(tmp_path / name))
            buffers = dict(module.named_buffers())
            torch.testing.assert_close(buffers["model.calibration.0.stats"], window)
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


def _calibration_vector(cfg: WorkerConfig) -> str:
    return cfg.summary_vector_name(CALIBRATION_VECTOR)


def test_the_window_is_a_ps_summary_vector_every_worker_loads() -> None:
    """The window's sums live on the PS, decayed once per batch: a second worker joining
    the same PS scores with the first one's window, not an empty one."""
    cfg = _config(True)
    ps = LocalPS(cfg.ps.config)
    first = Trainer(cfg, ps, 4)
    try:
        first.run_pass(uniform_stream(0, 10, 0.3))
        on_ps = ps.pull_dense(_calibration_vector(cfg))
        np.testing.assert_array_equal(on_ps, first.model.calibration[0].stats.numpy())
        # 10 batches of 100 in a window of 400 at batch size 64: sum of decay ** i * 100
        decay = window_decay(400.0, 64)
        assert on_ps[0] == pytest.approx(100 * (1 - decay**10) / (1 - decay), rel=1e-5)
        second = Trainer(cfg, ps, 4)
        try:
            np.testing.assert_array_equal(second.model.calibration[0].stats.numpy(), on_ps)
        finally:
            second.close()
    finally:
        first.close()


def test_a_restart_from_a_checkpoint_continues_bit_identically(tmp_path: Path) -> None:
    """Kill and restart between passes (a new PS loaded from the checkpoint, a new worker):
    the next pass scores and trains exactly as the run that went on. A window kept only in
    the worker's memory restarted empty and scored differently (the reverted first cut)."""
    cfg = _config(True)
    passes = [uniform_stream(i, 8, rate) for i, rate in enumerate((0.05, 0.3, 0.1))]
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, 4)
    try:
        for batches in passes[:2]:
            trainer.run_pass(batches)
        ps.save(str(tmp_path / "ckpt"), SaveMode.CHECKPOINT)
        assert trainer.model.calibration[0].stats[1] > 0  # a window worth restoring
        went_on = trainer.run_pass(passes[2])
    finally:
        trainer.close()
    restored = LocalPS(cfg.ps.config)
    restored.load(str(tmp_path / "ckpt"))
    restarted = Trainer(cfg, restored, 4)
    try:
        again = restarted.run_pass(passes[2])
    finally:
        restarted.close()
    assert (again.loss, again.auc, again.predicted_ctr) == (
        went_on.loss,
        went_on.auc,
        went_on.predicted_ctr,
    )
    for name in (cfg.dense_name, cfg.summary_name, _calibration_vector(cfg)):
        np.testing.assert_array_equal(ps.pull_dense(name), restored.pull_dense(name))
    keys = np.concatenate([b.keys for b in passes[2]])
    np.testing.assert_array_equal(
        ps.pull_sparse(cfg.table, keys), restored.pull_sparse(cfg.table, keys)
    )


def test_a_window_vector_of_another_decay_is_refused_naming_the_settings() -> None:
    """What resuming a checkpoint written with another window or batch size meets."""
    cfg = _config(True)
    ps = LocalPS(cfg.ps.config)
    Trainer(cfg, ps, 4).close()
    with pytest.raises(ValueError, match=r"model\.calibrationWindow and model\.batchSize"):
        Trainer(_config(True, window=300), ps, 4)


def test_a_window_lagging_the_pass_sums_still_corrects_finitely() -> None:
    """The PS's sums loaded at a dense sync can lag this worker's latest pushes, so the
    window can hold fewer examples than the pass part: the correction stays finite."""
    layer = ResidualCalibration(window_decay(300.0, 64), 10.0, pass_split=True)
    layer.stats.copy_(torch.tensor([355.2, 65.7, 69.6]))
    layer.pass_sums.copy_(torch.tensor([382.1, 68.7, 54.5]))
    assert torch.isfinite(layer.offset())
