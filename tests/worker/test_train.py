"""Test-then-train against an in-process PS (LocalPS) on the real Criteo sample."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import CollectorRegistry

from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.errors import PSUnavailableError
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data import synth
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.monitoring import WorkerMetrics
from streamtrain_worker.training.train import Trainer

from .conftest import run, worker_config


@pytest.mark.parametrize("model", ["slot_dnn", "deepfm"])
def test_passes_improve_auc(chunks: list[str], model: str) -> None:
    cfg = worker_config(type=model)
    ps = LocalPS(cfg.ps.config, num_shards=2)
    registry = CollectorRegistry()
    trainer = Trainer(cfg, ps, cfg.data.num_slots, monitoring=WorkerMetrics(registry))
    try:
        aucs = [run(trainer, [f]).auc for f in chunks]
    finally:
        trainer.close()
    # Each pass is scored before it is trained on (progressive validation), on new rows.
    assert aucs[0] < 0.66, aucs
    assert min(aucs[3:]) > aucs[0] + 0.04, aucs
    assert registry.get_sample_value("streamtrain_worker_examples_total") == 7200
    assert registry.get_sample_value("streamtrain_worker_passes_total") == 6
    assert registry.get_sample_value("streamtrain_worker_ps_pull_seconds_count") == 36


@pytest.mark.parametrize("model", ["slot_dnn", "deepfm"])
def test_predict_before_train(chunks: list[str], model: str) -> None:
    """A training pass reports exactly the metrics of an evaluation of the same batch."""
    # One batch: its prediction precedes any update. slot_dnn's data norm applies the same
    # (global) statistics in training and evaluation, so the two agree for it as well. The
    # residual calibration scores a training batch example by example, each with the
    # examples before it counted (tests/worker/test_calibration.py), so it is off here.
    cfg = worker_config(batchSize=1200, type=model, residualCalibration=False)
    results = []
    for train in (True, False):
        trainer = Trainer(cfg, LocalPS(cfg.ps.config), cfg.data.num_slots)
        try:
            results.append(run(trainer, chunks[:1], train=train))
        finally:
            trainer.close()
    trained, evaluated = results
    assert trained.examples == evaluated.examples == 1200
    assert np.array_equal(trained.pos, evaluated.pos)
    assert np.array_equal(trained.neg, evaluated.neg)
    assert trained.loss_sum == pytest.approx(evaluated.loss_sum, rel=1e-12)


def test_evaluation_changes_nothing_and_dense_lives_on_the_ps(chunks: list[str]) -> None:
    cfg = worker_config()
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, cfg.data.num_slots)
    try:
        run(trainer, chunks[:1])
        keys = ps.stats().tables[0].keys
        assert keys > 1000
        dense = ps.pull_dense(cfg.dense_name)
        run(trainer, chunks[1:2], train=False)
        assert ps.stats().tables[0].keys == keys  # evaluation pushes nothing
        assert np.array_equal(ps.pull_dense(cfg.dense_name), dense)
        # the local copy is the PS's after a sync; a second worker adopts the PS values
        trainer.sync_dense()
        other = Trainer(WorkerConfig.from_dict({**cfg.to_dict(), "seed": 99}), ps, 39)
        try:
            local = np.concatenate([p.detach().numpy().ravel() for p in other.model.parameters()])
            assert np.array_equal(local, dense)
        finally:
            other.close()
    finally:
        trainer.close()


def test_ps_failure_surfaces_in_the_pass(chunks: list[str]) -> None:
    cfg = worker_config()
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, cfg.data.num_slots)
    try:
        bad = WorkerConfig.from_dict(
            {
                **cfg.to_dict(),
                "table": "missing",
                "ps": {"config": {"tables": [{"name": "missing"}], "logicalShards": 8}},
            }
        )
        broken = Trainer(bad, ps, 39)  # this PS has no table "missing"
        with pytest.raises(KeyError, match="missing"):
            run(broken, chunks[:1])
        broken.close()
        assert run(trainer, chunks[:1]).examples == 1200  # the good trainer is unaffected
    finally:
        trainer.close()


def behaviour_batches(seed: int, count: int, size: int = 128) -> list[Batch]:
    """Slots: 0 target item, 1 user, 2 behaviour sequence (0-6 items), 3 context.
    Clicks are likelier when the target item is in the user's history."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        keys: list[int] = []
        lengths: list[int] = []
        labels = []
        for _ in range(size):
            history = rng.choice(40, size=rng.integers(0, 7), replace=False)
            in_history = len(history) > 0 and rng.random() < 0.5
            target = int(rng.choice(history)) if in_history else int(rng.integers(0, 40))
            labels.append(float(rng.random() < (0.7 if target in history else 0.1)))
            bags = [
                [1000 + target],
                [2000 + int(rng.integers(0, 1000))],
                [5000 + int(h) for h in history],
                [3000 + int(rng.integers(0, 5))],
            ]
            for bag in bags:
                keys += bag
                lengths.append(len(bag))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        batches.append(
            Batch(np.array(labels, np.float32), np.array(keys, np.uint64), offsets, num_slots=4)
        )
    return batches


@pytest.mark.parametrize("model", ["din", "wide_deep"])
def test_sequence_and_wide_models_train_through_the_ps(model: str) -> None:
    cfg = WorkerConfig.from_dict(
        {
            "data": {"format": "slot", "numSlots": 4, "sequenceSlot": 2},
            "model": {
                "type": model,
                "embeddingDim": 4,
                "hiddenUnits": [16],
                "attentionUnits": [8],
                "batchSize": 128,
                "denseSyncSteps": 1,
            },
            "metrics": {"numBuckets": 1024},
            "ps": {
                "config": {
                    "logicalShards": 4,
                    "tables": [
                        {"embedxDim": 4, "embedxThreshold": 0, "optimizer": {"initialRange": 0.1}}
                    ],
                    "dense": {"optimizer": {"learningRate": 0.01}},
                }
            },
        }
    )
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, num_slots=4, sequence_slot=cfg.data.sequenceSlot)
    history_keys = np.arange(5000, 5040, dtype=np.uint64)
    try:
        aucs = [trainer.run_pass(behaviour_batches(p, 8)).auc for p in range(5)]
        before = ps.pull_sparse("embedding", history_keys)
        trainer.run_pass(behaviour_batches(99, 2))
        after = ps.pull_sparse("embedding", history_keys)
    finally:
        trainer.close()
    # Learned: the last passes clearly above chance and above the untrained first pass
    # (which the base-rate offset no longer starts below chance).
    assert np.mean(aucs[-2:]) > max(aucs[0], 0.55), aucs
    # the behaviour-sequence keys were pushed: shows grew and their weights moved
    assert (after[:, 0] > before[:, 0]).all()
    assert not np.array_equal(after[:, 2:], before[:, 2:])


def test_without_overlap_runs_are_bitwise_reproducible(chunks: list[str]) -> None:
    cfg = WorkerConfig.from_dict({**worker_config().to_dict(), "runtime": {"overlap": False}})
    results = []
    for _ in range(2):
        ps = LocalPS(cfg.ps.config)
        trainer = Trainer(cfg, ps, cfg.data.num_slots)
        try:
            metrics = [run(trainer, [f]) for f in chunks[:2]]
        finally:
            trainer.close()
        results.append((metrics, ps.pull_dense(cfg.dense_name)))
    (first, dense_a), (second, dense_b) = results
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(a.pos, b.pos) and np.array_equal(a.neg, b.neg)
        assert a.loss_sum == b.loss_sum and a.pred_sum == b.pred_sum
    assert np.array_equal(dense_a, dense_b)


class SlowPushPS:
    """LocalPS whose pushes take a while; records, per sparse pull, its thread and how many
    pushes had been applied when it started."""

    def __init__(self, ps: LocalPS) -> None:
        self.ps = ps
        self.pushed = 0
        self.pulls: list[tuple[str, int]] = []

    def pull_sparse(self, table: str, keys: np.ndarray) -> np.ndarray:
        self.pulls.append((threading.current_thread().name, self.pushed))
        return self.ps.pull_sparse(table, keys)

    def push_batch(self, table, push, dense=()):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        self.ps.push_batch(table, push, dense=dense)
        self.pushed += 1

    def __getattr__(self, name: str) -> object:
        return getattr(self.ps, name)


def test_the_first_batches_train_on_rows_pulled_after_every_earlier_push(
    chunks: list[str],
) -> None:
    """The batches of a worker's first ``inOrderExamples`` pull again once the pushes before
    them are applied (the prefetched rows would miss them); later batches use the prefetched
    rows."""
    runtime = {"overlap": True, "inOrderExamples": 701}  # 4 batches of 200 start below it
    cfg = WorkerConfig.from_dict({**worker_config().to_dict(), "runtime": runtime})
    slow = SlowPushPS(LocalPS(cfg.ps.config))
    trainer = Trainer(cfg, slow, cfg.data.num_slots)  # type: ignore[arg-type]
    try:
        run(trainer, chunks[0:1])  # 6 batches of 200
        run(trainer, chunks[1:2])
    finally:
        trainer.close()
    assert trainer.trained_examples == 12 * 200
    in_order = [pushed for thread, pushed in slow.pulls if thread != "prefetch"]
    assert in_order == [0, 1, 2, 3]
    prefetched = [pushed for thread, pushed in slow.pulls if thread == "prefetch"]
    assert len(prefetched) == 12
    # the prefetch thread ran ahead of the slow pushes: its rows were stale
    assert any(pushed < i for i, pushed in enumerate(prefetched))


def test_a_sync_beside_pushes_in_flight_keeps_this_workers_counts(chunks: list[str]) -> None:
    """With overlap, a dense sync's pull runs beside this worker's queued pushes. The counts
    it loads (``models.summary``) must still hold every batch this worker trained, or the
    calibration's window loses its latest examples at every sync. Pushes slowed down and a
    sync every step make the race certain: after each step the window's example count is
    exactly the decayed count of the batches trained so far."""
    runtime = {"overlap": True, "inOrderExamples": 0}
    base = worker_config(denseSyncSteps=1).to_dict()
    cfg = WorkerConfig.from_dict({**base, "runtime": runtime})
    slow = SlowPushPS(LocalPS(cfg.ps.config))
    trainer = Trainer(cfg, slow, cfg.data.num_slots)  # type: ignore[arg-type]
    window = trainer.model.calibration[0]
    seen: list[tuple[int, float]] = []
    step = trainer.step

    def counted(prepared, train):  # type: ignore[no-untyped-def]
        out = step(prepared, train)
        seen.append((prepared.batch.size, float(window.stats[0])))
        return out

    trainer.step = counted  # type: ignore[method-assign]
    try:
        run(trainer, chunks[0:2])
        assert trainer.dense_version >= 4  # two passes, a sync loaded at each start and end
    finally:
        trainer.close()
    want = 0.0
    for size, count in seen:
        want = window.decay * want + size
        assert count == pytest.approx(want, rel=1e-5)


class FlakyPS:
    """LocalPS whose sparse calls fail with PSUnavailableError while ``down`` is set: the
    second pull fails, and a push fails once that pull has failed — so a push is still
    queued, and fails, after the pass has already failed on the pull."""

    def __init__(self, ps: LocalPS) -> None:
        self.ps = ps
        self.down = False
        self.pulls = 0
        self.pull_failed = threading.Event()

    def pull_sparse(self, table: str, keys: np.ndarray) -> np.ndarray:
        self.pulls += 1
        if self.down and self.pulls >= 2:
            self.pull_failed.set()
            raise PSUnavailableError("pull_sparse on ps-0:7000: UNAVAILABLE")
        return self.ps.pull_sparse(table, keys)

    def push_sparse(self, table, push):  # type: ignore[no-untyped-def]
        if self.down:
            assert self.pull_failed.wait(timeout=30)
            raise PSUnavailableError("push_sparse on ps-0:7000: UNAVAILABLE")
        self.ps.push_sparse(table, push)

    def push_batch(self, table, push, dense=()):  # type: ignore[no-untyped-def]
        for name, values in dense:
            self.ps.push_dense(name, values)
        self.push_sparse(table, push)

    def __getattr__(self, name: str) -> object:
        return getattr(self.ps, name)


def test_a_failed_pass_does_not_poison_the_next(chunks: list[str]) -> None:
    cfg = WorkerConfig.from_dict({**worker_config().to_dict(), "runtime": {"prefetchBatches": 1}})
    flaky = FlakyPS(LocalPS(cfg.ps.config))
    trainer = Trainer(cfg, flaky, cfg.data.num_slots)  # type: ignore[arg-type]
    try:
        flaky.down = True
        with pytest.raises(PSUnavailableError, match="pull_sparse"):
            run(trainer, chunks[:1])
        flaky.down = False  # the PS is back: the next pass is clean
        assert run(trainer, chunks[1:2]).examples == 1200
    finally:
        trainer.close()


class RestartablePS:
    """A PSLike whose server can be replaced by a fresh, empty one (a restart)."""

    def __init__(self, ps: LocalPS) -> None:
        self.ps = ps

    def __getattr__(self, name: str) -> object:
        return getattr(self.ps, name)


def test_a_ps_restarted_empty_gets_the_dense_vector_again(chunks: list[str]) -> None:
    cfg = worker_config()
    ps = RestartablePS(LocalPS(cfg.ps.config))
    trainer = Trainer(cfg, ps, cfg.data.num_slots)  # type: ignore[arg-type]
    try:
        run(trainer, chunks[:1])
        trainer.sync_dense()
        trained = trainer._flat_params.numpy().copy()
        ps.ps = LocalPS(cfg.ps.config)  # restarted without a checkpoint to load
        trainer.sync_dense()
        # the worker offered what it had; the PS did not start from a new initialisation
        assert np.array_equal(ps.ps.pull_dense(cfg.dense_name), trained)
        assert run(trainer, chunks[1:2]).examples == 1200
    finally:
        trainer.close()


def test_din_learns_the_synthetic_stream_through_the_reader(tmp_path: Path) -> None:
    """DIN on the generator's slot-format stream (behaviour sequence slot ``hist``), read by
    the real reader: it improves pass over pass and stays below the generator's oracle."""
    stream = synth.SynthConfig(
        out=str(tmp_path / "stream"),
        days=1,
        split_interval_minutes=240,
        rows_per_folder=2000,
        num_users=2000,
        num_items=500,
    )
    generated = synth.generate(stream)
    cfg = WorkerConfig.from_dict(
        {
            "data": synth.data_config(stream),
            "model": {
                "type": "din",
                "targetSlot": synth.TARGET_SLOT,
                "hiddenUnits": [32, 16],
                "attentionUnits": [16],
                "batchSize": 200,
                "denseSyncSteps": 2,
            },
            "metrics": {"numBuckets": 4096},
            "ps": {"config": {"logicalShards": 8}},
        }
    )
    assert cfg.data.sequenceSlot == synth.SEQUENCE_SLOT
    trainer = Trainer(cfg, LocalPS(cfg.ps.config), cfg.data.num_slots, cfg.data.sequenceSlot)
    aucs = []
    try:
        for folder in generated.folders:
            files = sorted(str(p) for p in Path(folder).glob("part-*"))
            aucs.append(run(trainer, files).auc)
    finally:
        trainer.close()
    oracle = [p.oracle_auc for p in generated.passes]
    assert len(aucs) == len(oracle) == 6
    assert np.mean(aucs[-2:]) > aucs[0] + 0.08, aucs
    assert all(a < o + 0.02 for a, o in zip(aucs, oracle, strict=True)), (aucs, oracle)


class GatedDensePS(LocalPS):
    """A PS whose first dense push waits until the trainer has queued every later push, so
    the push thread finds a backlog: what a slow or loaded PS produces, made deterministic.

    The gate opens once the trainer has submitted ``pushes`` pushes (``open_after``).
    """

    def __init__(self, config: WorkerConfig) -> None:
        super().__init__(config.ps.config)
        self.parameters = config.dense_name  # data-norm statistics are not counted
        self.gate = threading.Event()
        self.dense_pushes = 0

    def open_after(self, trainer: Trainer, pushes: int) -> None:
        """Open the gate, in a thread of its own, once ``trainer`` queued ``pushes``."""

        def watch() -> None:
            deadline = time.monotonic() + 60
            while trainer._pusher.submitted < pushes and time.monotonic() < deadline:
                time.sleep(0.005)
            self.gate.set()

        threading.Thread(target=watch, daemon=True).start()

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> None:
        if name == self.parameters:
            if self.dense_pushes == 0 and not self.gate.wait(timeout=60):
                raise AssertionError("the trainer never queued its last push")
            self.dense_pushes += 1
        super().push_dense(name, grads)


@pytest.mark.parametrize(("max_merged", "steps"), [(None, {6}), (4, {2, 3})])
def test_every_batch_is_one_dense_step_unless_merging_is_asked_for(
    chunks: list[str], max_merged: int | None, steps: set[int]
) -> None:
    """A backlog of pushes must not silently shrink the number of optimizer steps (a merged
    push is one Adam step for several batches: a lower effective learning rate)."""
    raw = worker_config(batchSize=200, denseSyncSteps=6).to_dict()
    raw["runtime"]["pushQueueDepth"] = 8
    raw["runtime"]["inOrderExamples"] = 0  # the backlog starts at the first batch
    if max_merged is not None:
        raw["runtime"]["maxMergedPushes"] = max_merged
    cfg = WorkerConfig.from_dict(raw)
    ps = GatedDensePS(cfg)
    trainer = Trainer(cfg, ps, cfg.data.num_slots)
    ps.open_after(trainer, 6)
    try:
        result = run(trainer, chunks[:1])  # 1,200 rows: 6 batches
    finally:
        trainer.close()
    assert result.examples == 1200
    # default: 6 batches, 6 steps; merging 4: [1], [2, 3, 4, 5], [6] — or [1, 2], [3, 4,
    # 5, 6] when batch 2 was queued before the push thread woke up for batch 1 (a loaded box)
    assert ps.dense_pushes in steps


def test_a_dense_vector_of_another_slot_count_is_refused_naming_the_crosses() -> None:
    """A job resumed with the crossed slots on from a checkpoint written without them (the
    default changed in issue 26): the worker names the settings that change the shape."""
    slots = {"format": "slot", "slots": ["user", "item", "hour"]}

    def config(crosses: list[str] | None) -> WorkerConfig:
        data = slots if crosses is None else {**slots, "crosses": crosses}
        return WorkerConfig.from_dict({"data": data, "model": {"hiddenUnits": [8]}})

    old = config([])
    ps = LocalPS(old.ps.config)
    Trainer(old, ps, old.data.num_slots).close()
    new = config(None)
    assert new.data.num_slots == 3 + 3
    with pytest.raises(ValueError, match=r"another shape.*data\.crosses change it"):
        Trainer(new, ps, new.data.num_slots)
