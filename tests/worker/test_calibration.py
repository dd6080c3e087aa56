"""The online residual calibration (``models.calibration``): a logit correction over a
recent window of trained examples, test then train, held on the PS (checkpointed, shared by
the workers) and exported with the network."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.models.calibration import (
    CALIBRATION_VECTOR,
    EVIDENCE_VECTOR,
    MAX_LOG_GRADIENT_RATIO,
    PERSISTENCE_PRIOR_PAIRS,
    RateMovement,
    ResidualCalibration,
    ResidualPersistence,
    residual,
    uncalibrated_gradient_ratio,
    window_decay,
    window_noise,
)
from streamtrain_worker.publishing.export import export_dense, load_dense
from streamtrain_worker.training.train import Trainer

from .conftest import hour_stream, uniform_stream


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


def _corrections(
    layer: ResidualCalibration,
    rates: list[float],
    seed: int,
    raw_rate: float = 0.05,
    pass_batches: int = 0,
) -> list[float]:
    """The correction each batch of 64 was scored with, a network stuck at ``raw_rate``,
    the stream's click rate ``rates[i]`` in batch ``i``, a new pass every
    ``pass_batches`` batches (0: none)."""
    rng = np.random.default_rng(seed)
    raw = torch.full((64,), math.log(raw_rate / (1.0 - raw_rate)))
    out = []
    for i, rate in enumerate(rates):
        if pass_batches and i % pass_batches == 0:
            layer.begin_pass()
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


def _config(
    calibration: bool,
    window: float = 400,
    in_loss: bool = True,
    spares: bool = False,
    context_rate: bool = False,
) -> WorkerConfig:
    """The calibration alone: without the context rate (``models.context_rate``), which
    takes an hour key's rate from its counts instead."""
    return WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4},
            "model": {
                "hiddenUnits": [16],
                "residualCalibration": calibration,
                "calibrationWindow": window,
                "calibrationInLoss": in_loss,
                "calibrationSparesContextKeys": spares,
                "contextRate": context_rate,
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


def test_an_hour_key_learns_its_hours_rate_where_the_calibration_would_absorb_it() -> None:
    """Hours 0 (5 %) and 1 (35 %) in turn, a pass each, two days: with the calibration in
    the loss the network's own (uncorrected) predictions of the two hours stay close (the
    window absorbed the difference); with ``calibrationSparesContextKeys`` the hour keys
    learn it (2.8 on the logit where 2.3 is due: the row-shared step of a key in every row
    overshoots a little), so a model predicts an hour's rate before its window sees it."""
    spread = {}
    for spares in (False, True):
        cfg = _config(True, window=300, spares=spares)
        trainer = Trainer(cfg, LocalPS(cfg.ps.config), 4)
        try:
            for day in range(2):
                for hour, rate in ((0, 0.05), (1, 0.35)):
                    trainer.run_pass(hour_stream(10 * day + hour, hour, rate))
            own = []
            for hour in (0, 1):
                probe = trainer.prepare(hour_stream(99, hour, 0.2, batches=1)[0])
                scored = trainer.step(probe, train=False).preds
                offset = float(trainer.model.calibration_offset())
                own.append(float(np.mean(np.log(scored / (1.0 - scored)) - offset)))
        finally:
            trainer.close()
        spread[spares] = own[1] - own[0]
    true_spread = math.log(0.35 / 0.65) - math.log(0.05 / 0.95)  # 2.32 on the logit
    assert abs(spread[True] - true_spread) < 0.35 * true_spread, spread
    assert spread[False] < 0.5 * true_spread, spread


def test_a_scored_example_never_sees_its_own_label_nor_a_later_one() -> None:
    """Two trainers on the same stream, one label of the last batch flipped in one: the
    scores of that example and every one before it are the same (each example is scored
    with the examples before it counted, test then train); the ones after it differ, and
    so does the next batch."""
    history = uniform_stream(0, 5, 0.1)
    last, after = uniform_stream(1, 2, 0.1)
    flip = 20
    labels = last.labels.copy()
    labels[flip] = 1.0 - labels[flip]
    flipped = Batch(labels, last.keys, last.offsets, num_slots=4)
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
    np.testing.assert_array_equal(scored_a[: flip + 1], scored_b[: flip + 1])
    assert not np.allclose(scored_a[flip + 1 :], scored_b[flip + 1 :])
    assert window_a[1] != window_b[1]  # the label did count, after scoring
    assert not np.allclose(next_a, next_b)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=40),
    rates=st.lists(st.floats(0.001, 0.999), min_size=40, max_size=40),
    history=st.lists(st.floats(0.01, 0.6), min_size=0, max_size=6),
    in_pass=st.integers(0, 3),
)
def test_example_by_example_is_one_example_at_a_time(
    labels: list[float], rates: list[float], history: list[float], in_pass: int
) -> None:
    """The batch's per-example corrections are what the layer gives each example with the
    batch's earlier examples added to its sums one at a time (a loop, the reference), and
    the first example's is the batch-start correction; observing the batch then leaves the
    sums a batch-at-once observe would."""
    layer = ResidualCalibration(window_decay(300.0, 64), 10.0, pass_split=True, evidence=True)
    reference = ResidualCalibration(window_decay(300.0, 64), 10.0, pass_split=True, evidence=True)
    for rate in history:
        for model in (layer, reference):
            model.begin_pass()
            for _ in range(in_pass + 1):
                model(torch.zeros(64))
                model.observe(torch.full((64,), rate).round(), torch.zeros(64))
    n = len(labels)
    target = torch.tensor(labels)
    raw = torch.logit(torch.tensor(rates[:n]))
    layer.follow_labels(target)
    scored = layer(raw) - raw
    start = reference.offset()
    stats, pass_sums = reference.stats.clone(), reference.pass_sums.clone()
    expected = []
    for i in range(n):
        expected.append(reference._correction(stats, pass_sums))
        seen = torch.stack([torch.ones(()), target[i], torch.sigmoid(raw[i])])
        stats, pass_sums = stats + seen, pass_sums + seen
    torch.testing.assert_close(scored, torch.stack(expected), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(scored[0], start, rtol=1e-5, atol=1e-5)
    layer.observe(target, raw + scored)
    reference.observe(target, raw + reference.offset())  # its raw: ``raw`` again
    torch.testing.assert_close(layer.stats, reference.stats, rtol=1e-5, atol=1e-4)


def test_the_export_and_a_snapshot_export_carry_the_correction(tmp_path: Path) -> None:
    cfg = _config(True)
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, 4)
    try:
        trainer.run_pass(uniform_stream(1, 5, 0.1))
        trainer.run_pass(uniform_stream(0, 10, 0.3))  # a pass whose persistence is open
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
            # every buffer finite: serving refuses a model that is not
            assert all(bool(torch.isfinite(b).all()) for b in buffers.values()), name
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
    evidence = cfg.summary_vector_name(EVIDENCE_VECTOR)
    assert restored.pull_dense(evidence)[0] > 0  # the evidence was checkpointed too
    for name in (cfg.dense_name, cfg.summary_name, _calibration_vector(cfg), evidence):
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


def _with_evidence() -> ResidualCalibration:
    return ResidualCalibration(window_decay(300.0, 64), 10.0, evidence=True)


def test_a_stationary_stream_gets_little_of_its_noise_a_moving_one_all_of_its_residual() -> None:
    """A stationary stream, the network at its rate: the window's residual is sampling
    noise, and with the evidence the correction applied is a fraction of it (root mean
    square below a third of the plain window's). A stream whose rate moves by hours (10 %
    / 40 % every ten batches, the network at 20 %): the rate's movement dwarfs its noise,
    the strength stays near 1 and the correction is the window's."""

    def plain() -> ResidualCalibration:
        return ResidualCalibration(window_decay(300.0, 64), 10.0)

    def steady(layer: ResidualCalibration) -> np.ndarray:
        return np.array(_corrections(layer, [0.2] * 800, 1, 0.2, pass_batches=5)[200:])

    assert (
        np.sqrt(np.mean(steady(_with_evidence()) ** 2)) < np.sqrt(np.mean(steady(plain()) ** 2)) / 3
    )
    hours = ([0.1] * 10 + [0.4] * 10) * 20
    moving_plain = np.array(_corrections(plain(), hours, 2, 0.2, pass_batches=10))
    layer = _with_evidence()
    moving = np.array(_corrections(layer, hours, 2, 0.2, pass_batches=10))
    strength = layer.evidence[0].strength(torch.tensor(0.01))
    assert float(strength) > 0.9, strength
    # after the evidence's first windows the corrections are the window's within 10 %
    assert np.max(np.abs(moving[100:] - moving_plain[100:])) < 0.1 * np.max(np.abs(moving_plain))


def test_before_any_evidence_the_whole_residual_is_applied() -> None:
    layer = _with_evidence()
    plain = ResidualCalibration(window_decay(300.0, 64), 10.0)
    for each in (layer, plain):
        each.stats.copy_(torch.tensor([300.0, 90.0, 45.0]))
    assert float(layer.evidence[0].stats[0]) == 0.0
    torch.testing.assert_close(layer.offset(), plain.offset())


def test_the_evidence_follows_the_ps_rule_and_counts_the_window_a_pass_starts_from() -> None:
    """``pending`` holds what a batch adds; ``stats`` decays, then adds, as the PS does;
    a training pass's first batch counts the window it was scored with (before it joined
    the window), the other batches and an evaluation pass nothing."""
    layer = _with_evidence()
    layer.stats.copy_(torch.tensor([300.0, 90.0, 45.0]))
    before = float(layer.offset())  # no evidence yet: the plain residual
    layer.begin_pass()
    for _ in range(3):  # the pass's first batch counts the window; the others nothing
        logits = layer(torch.zeros(64))
        layer.observe(torch.ones(64), logits)
    evidence = layer.evidence[0]
    assert isinstance(evidence, RateMovement)
    torch.testing.assert_close(evidence.stats, evidence.pending)
    log_odds = math.log(100 / 220)  # the window's 90 clicks of 300, 10 pseudo-clicks
    torch.testing.assert_close(
        evidence.stats[:3], torch.tensor([1.0, log_odds, log_odds**2]), rtol=1e-5, atol=0.0
    )
    assert before != 0.0
    counted = evidence.stats.clone()
    layer.eval()
    layer.begin_pass()  # an evaluation pass: scored, never trained on, never counted
    layer.observe(torch.ones(64), layer(torch.zeros(64)))
    torch.testing.assert_close(evidence.stats, counted)
    layer.train()
    layer.begin_pass()
    layer.observe(torch.ones(64), layer(torch.zeros(64)))
    assert float(evidence.stats[0]) == 2.0


_finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
_count = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=300, deadline=None)
@given(
    evidence_stats=st.tuples(_count, _finite, _count, _count),
    window=st.tuples(_count, st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
    training=st.booleans(),
)
def test_any_finite_evidence_applies_a_share_of_the_plain_correction(
    evidence_stats: tuple[float, float, float, float],
    window: tuple[float, float, float],
    training: bool,
) -> None:
    """Whatever finite sums the PS hands back (a hostile or corrupted vector), the
    strength is in [0, 1] and the correction is that share of the plain layer's: finite,
    never larger, never of the other sign."""
    examples, click_share, predicted_share = window
    sums = torch.tensor([examples, examples * click_share, examples * predicted_share])
    layer = _with_evidence()
    plain = ResidualCalibration(window_decay(300.0, 64), 10.0)
    for each in (layer, plain):
        each.stats.copy_(sums)
        each.train(training)
    layer.evidence[0].stats.copy_(torch.tensor(evidence_stats))
    strength = float(layer.strength())
    assert 0.0 <= strength <= 1.0, strength
    corrected, whole = float(layer.offset()), float(plain.offset())
    assert math.isfinite(corrected)
    assert abs(corrected) <= abs(whole) * (1 + 1e-5) + 1e-6
    assert corrected * whole >= 0.0


@pytest.mark.parametrize("rate", [0.25, 0.02])
def test_the_noise_variance_is_the_residuals_own_where_nothing_is_to_correct(rate: float) -> None:
    """A network at the stream's own rate: the window's residual is pure sampling noise,
    and ``window_noise`` is its variance within 15 % at 25 % and at 2 % clicks (the plain
    click log-odds variance overstates it 2.4x at 2 %: the pseudo-clicks shrink it)."""
    layer = ResidualCalibration(window_decay(300.0, 64), 10.0)
    rng = np.random.default_rng(0)
    raw = torch.full((64,), math.log(rate / (1.0 - rate)))
    residuals, noises = [], []
    for i in range(2500):
        logits = layer(raw)
        if i >= 100:
            residuals.append(float(residual(layer.stats, 10.0)))
            noises.append(float(window_noise(layer.stats, 10.0, layer.decay)))
        layer.observe(torch.from_numpy((rng.random(64) < rate).astype(np.float32)), logits)
    assert np.mean(noises) == pytest.approx(np.mean(np.square(residuals)), rel=0.15)


@settings(max_examples=300, deadline=None)
@given(logit=_finite, offset=_finite, clicked=st.booleans())
@example(logit=4194305.0, offset=0.75, clicked=True)
def test_the_uncalibrated_gradient_ratio_is_the_two_log_loss_gradients_ratio(
    logit: float, offset: float, clicked: bool
) -> None:
    """``(sigmoid(z - c) - y) / (sigmoid(z) - y)`` where float64 holds both gradients;
    for any finite float32 logits and offsets finite, and within ``exp(+-|c'|)`` (at most
    e^30 above), ``c'`` the offset float32 applies: ``z - (z - c)``, which rounds where
    ``z`` is large (z = 4194305, c = 0.75: ``z - c`` rounds to 4194304, c' = 1)."""
    z, c, y = torch.tensor([logit]), torch.tensor([offset]), torch.tensor([float(clicked)])
    got = float(uncalibrated_gradient_ratio(z, c, y)[0])
    zf, cf = float(z[0]), float(c[0])
    applied = abs(float((z - (z - c))[0]))
    assert math.isfinite(got) and got >= 0.0
    assert got <= math.exp(min(applied, MAX_LOG_GRADIENT_RATIO)) * (1 + 1e-5)
    if applied < 80:
        assert got >= math.exp(-applied) * (1 - 1e-5)
    if max(abs(zf), abs(zf - cf)) < 20:  # both gradients well inside float64
        y64 = float(clicked)
        want = (1 / (1 + math.exp(cf - zf)) - y64) / (1 / (1 + math.exp(-zf)) - y64)
        assert got == pytest.approx(want, rel=1e-4)


def _persistence_of(pairs: list[tuple[float, float]]) -> ResidualPersistence:
    """A persistence whose stats hold ``pairs`` of (window residual, pass's own need)."""
    persistence = ResidualPersistence()
    for r, needed in pairs:
        persistence.stats += torch.tensor([1.0, r, needed, r * r, r * needed])
    return persistence


def test_an_export_applies_the_line_from_a_pass_residual_to_the_next_pass_need() -> None:
    """Pairs on ``r' = 0.1 + 0.5 r``: the export's correction is that line, blended with
    the window's own by ``PERSISTENCE_PRIOR_PAIRS`` pairs (a slope needs two)."""
    rs = [-1.0, 0.5, 1.5, -0.2, 0.8, 0.0, 1.1, -0.7]
    persistence = _persistence_of([(r, 0.1 + 0.5 * r) for r in rs])
    fallback = torch.tensor(0.9)
    filled = (len(rs) - 1) / (len(rs) - 1 + PERSISTENCE_PRIOR_PAIRS)
    want = filled * (0.1 + 0.5 * 0.9) + (1 - filled) * 0.9
    got = persistence.predict(torch.tensor(0.9), fallback)
    assert float(got) == pytest.approx(want, abs=1e-5)
    # without pairs, and with one, the window's own correction
    for few in ([], [(0.3, 0.2)]):
        assert float(_persistence_of(few).predict(torch.tensor(0.9), fallback)) == pytest.approx(
            0.9
        )


def test_a_residual_that_flips_between_passes_exports_the_stream_mean_need() -> None:
    """``r' = 0.2 - r`` (the next hour's error the opposite of this one's): the slope is
    clamped at 0, the export corrects by the mean need, not by the window's residual."""
    rs = [float(v) for v in np.linspace(-1.0, 1.0, 41)]
    persistence = _persistence_of([(r, 0.2 - r) for r in rs])
    filled = 40 / (40 + PERSISTENCE_PRIOR_PAIRS)
    got = float(persistence.predict(torch.tensor(0.8), torch.tensor(0.8)))
    assert got == pytest.approx(filled * 0.2 + (1 - filled) * 0.8, abs=1e-5)


@settings(max_examples=300, deadline=None)
@given(stats=st.tuples(_count, _finite, _finite, _count, _finite), window=_finite)
def test_any_finite_persistence_exports_a_finite_correction(
    stats: tuple[float, ...], window: float
) -> None:
    """Whatever finite sums the PS hands back, the export's correction is finite."""
    persistence = ResidualPersistence()
    persistence.stats.copy_(torch.tensor(stats))
    assert math.isfinite(float(persistence.predict(torch.tensor(window), torch.tensor(0.5))))


def test_a_pass_pair_is_its_start_window_and_its_own_residual_pushed_as_it_grows() -> None:
    """Training passes at 10 %, 40 %, 20 %, an evaluation pass after each: the first starts
    from an empty window (no pair); each later one's pushes sum to the pair of the window
    it started from and its own undecayed residual, complete at its last batch, so a pass
    replayed from its start pushes it again whole. The evaluation passes count nothing.
    Training's corrections ignore the persistence."""
    layer = ResidualCalibration(window_decay(300.0, 64), 0.5, pass_split=True, evidence=True)
    persistence = layer.persistence[0]
    assert isinstance(persistence, ResidualPersistence)
    rng = np.random.default_rng(1)
    raw = torch.full((64,), -1.0)
    want = torch.zeros(5)
    for number, rate in enumerate((0.1, 0.4, 0.2)):
        layer.train()
        layer.begin_pass()
        started = residual(layer.stats, 0.5)
        own = torch.zeros(3)
        for _ in range(5):
            logits = layer(raw)
            labels = torch.from_numpy((rng.random(64) < rate).astype(np.float32))
            own += torch.stack([torch.tensor(64.0), labels.sum(), torch.sigmoid(raw).sum()])
            layer.observe(labels, logits)
        if number > 0:
            needed = residual(own, 0.5)
            want += torch.stack([torch.ones(()), started, needed, started**2, started * needed])
        torch.testing.assert_close(persistence.stats, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(persistence.pending, want, rtol=1e-4, atol=1e-5)
        layer.eval()
        layer.begin_pass()  # an evaluation pass: nothing counted
        layer(raw)
        torch.testing.assert_close(persistence.stats, want, rtol=1e-4, atol=1e-5)
    # training's corrections are the same whatever the persistence holds
    layer.train()
    layer.follow_labels(torch.zeros(64))
    before = layer(raw).detach().clone()
    persistence.stats.copy_(torch.tensor([50.0, 3.0, -9.0, 4.0, -7.0]))
    layer.follow_labels(torch.zeros(64))
    torch.testing.assert_close(layer(raw), before)
