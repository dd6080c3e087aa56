"""Checkpoints written beside the next pass (``checkpoint.besideTraining``).

The checkpoint is taken at the pass boundary (a PS snapshot), the next pass trains while
its files are written, and it becomes the restore point only once published. The real
driver and ``LocalPS``; the PS's write of the snapshot is held or failed by the test.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from pathlib import Path
from typing import Any

import numpy as np
from fakes import MANIFEST

from scripted_workers import DenseWorker, FakeRestartWatch, no_sleep, run, write_folder
from streamtrain_operator.job import render
from streamtrain_operator.job.messages import Action, CheckData, LoadCheckpoint
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import Job, parse_job
from streamtrain_operator.run.driver import Driver, Observer
from streamtrain_operator.run.state import MemoryStateStore
from streamtrain_ps.api import SaveMode, SaveResult
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard
from streamtrain_worker.proto.share import PassShare

DAY = "20261101"


def beside_job(root: Path, beside: bool = True) -> Job:
    """One day of two passes, a checkpoint after each (the first one followed by pass 2)."""
    for hhmm in ("0000", "1200"):
        write_folder(root, DAY, hhmm)
    m = copy.deepcopy(MANIFEST)
    m["spec"]["checkpoint"]["besideTraining"] = beside
    for section in ("data", "checkpoint", "export"):
        m["spec"][section]["path"] = str(root / m["spec"][section]["path"])
    return parse_job(m)


class HeldPS(LocalPS):
    """Holds (or fails) the write of a checkpoint snapshot until pass 2 has pushed."""

    def __init__(self, *args: Any, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail = fail
        self.pass_2_pushed = threading.Event()
        self.written: list[str] = []

    def save_snapshot(
        self, uri: str, mode: SaveMode, snapshot_id: str, meta: Any = None
    ) -> SaveResult:
        if mode == SaveMode.CHECKPOINT:
            assert self.pass_2_pushed.wait(30), "the checkpoint's write waited for pass 2"
            if self.fail:
                raise OSError("the checkpoint store is down")
            self.written.append(uri)
        return super().save_snapshot(uri, mode, snapshot_id, meta)


class Pass2Worker(DenseWorker):
    """Tells the PS once its share of pass 2 is pushed; records the restore point then."""

    def __init__(self, ps: HeldPS, index: int, store: MemoryStateStore) -> None:
        super().__init__(ps, index, FakeRestartWatch())
        self.held = ps
        self.store = store
        self.restore_point_in_pass_2: str | None = None

    async def run_pass(self, share: PassShare) -> Any:
        result = await super().run_pass(share)
        if share.pass_index == 2:
            recorded = self.store.load()
            assert recorded is not None and recorded.checkpoint is not None
            self.restore_point_in_pass_2 = recorded.checkpoint.uri
            await asyncio.sleep(0)
            self.held.pass_2_pushed.set()
        return result


def clean_run(root: Path) -> tuple[Progress, LocalPS]:
    job = beside_job(root, beside=False)
    ps = LocalPS(render.ps_config(job.spec), num_shards=2)
    watch = FakeRestartWatch()
    progress = run(job, [DenseWorker(ps, i, watch) for i in range(2)], ps, MemoryStateStore())
    return progress, ps


def digests(uri: str) -> list[str]:
    return sorted(f["sha256"] for f in checkpoint.read_manifest(uri).files.values())


def assert_same_model(ps: LocalPS, clean: LocalPS) -> None:
    assert ps.stats() == clean.stats()
    assert np.array_equal(ps.pull_dense(DenseWorker.DENSE), clean.pull_dense(DenseWorker.DENSE))


def test_a_checkpoint_is_written_beside_the_next_pass_and_recorded_once_published(
    tmp_path: Path,
) -> None:
    clean, clean_ps = clean_run(tmp_path / "clean")
    job = beside_job(tmp_path / "beside")
    ps = HeldPS(render.ps_config(job.spec), num_shards=2)
    store = MemoryStateStore()
    workers = [Pass2Worker(ps, i, store) for i in range(2)]
    progress = run(job, workers, ps, store)
    assert clean.phase == progress.phase == Phase.SUCCEEDED
    ckpt = tmp_path / "beside" / "ckpt" / DAY
    # Pass 2 pushed while the checkpoint of pass 1 was still unwritten (the PS held the
    # write until then): the restore point was still the genesis.
    assert ps.written == [str(ckpt / "pass-1-g1")]
    assert workers[0].restore_point_in_pass_2 == str(ckpt / "pass-0-g1")
    # The checkpoint holds pass 1's model, not pass 2's pushes: the same files as the
    # checkpoint a run without the overlap wrote at that point.
    clean_ckpt = tmp_path / "clean" / "ckpt" / DAY
    assert digests(str(ckpt / "pass-1-g1")) == digests(str(clean_ckpt / "pass-1-g1"))
    # The day-end checkpoint (the job's last step) is written in the path and recorded.
    assert progress.checkpoint is not None
    assert progress.checkpoint.key == StepKey(DAY, 2, StepKind.CHECKPOINT)
    assert digests(str(ckpt / "pass-2-g1")) == digests(str(clean_ckpt / "pass-2-g1"))
    assert_same_model(ps, clean_ps)


def test_a_checkpoint_failing_beside_a_pass_keeps_the_one_before_and_the_rerun_trains_once(
    tmp_path: Path,
) -> None:
    _, clean_ps = clean_run(tmp_path / "clean")
    job = beside_job(tmp_path / "beside")
    ps = HeldPS(render.ps_config(job.spec), num_shards=2, fail=True)
    store = MemoryStateStore()
    workers = [Pass2Worker(ps, i, store) for i in range(2)]
    failed = run(job, workers, ps, store)
    assert failed.phase == Phase.FAILED
    assert "CheckpointFailed" in failed.message and "pass-1-g1" in failed.message
    # Never published, never the restore point: the genesis still is; pass 2, which ran
    # beside the write, is not recorded.
    assert failed.checkpoint is not None and failed.checkpoint.key.pass_index == 0
    assert failed.completed == StepKey(DAY, 1, StepKind.CHECKPOINT)
    assert [r.pass_index for r in failed.history] == [1]
    assert not (tmp_path / "beside" / "ckpt" / DAY / "pass-1-g1" / checkpoint.MANIFEST).exists()

    # The rerun reloads the genesis, replays pass 1 (not the lost checkpoint), redoes pass
    # 2: every pass applied once, each recorded once.
    ps.fail = False
    progress = run(job, workers, ps, store)
    assert progress.phase == Phase.SUCCEEDED
    assert [(r.pass_index, r.generation) for r in progress.history] == [(1, 1), (2, 2)]
    assert progress.replayed_steps == 2  # pass 1 and its delta
    assert_same_model(ps, clean_ps)


def test_a_stop_before_the_next_pass_records_the_checkpoint_once_written(tmp_path: Path) -> None:
    job = beside_job(tmp_path)
    ps = LocalPS(render.ps_config(job.spec), num_shards=2)
    watch = FakeRestartWatch()
    store = MemoryStateStore()
    clock = iter(range(10_000))
    driver: Driver | None = None

    def stop_at_pass_2(action: Action, progress: Progress) -> None:
        if isinstance(action, CheckData) and action.key.pass_index == 2:
            assert driver is not None
            driver.stop()

    driver = Driver(
        job.spec,
        ps,
        [DenseWorker(ps, i, watch) for i in range(2)],
        store,
        clock=lambda: float(next(clock)),
        sleep=no_sleep,
        observer=Observer(on_action=stop_at_pass_2),
    )
    progress = asyncio.run(driver.run())
    # Stopped before pass 2: the checkpoint of pass 1, written meanwhile, is the restore
    # point in the saved record.
    assert progress.phase == Phase.STOPPED
    saved = store.load()
    assert saved is not None and saved.checkpoint is not None
    assert saved.checkpoint.key == StepKey(DAY, 1, StepKind.CHECKPOINT)
    assert [r.pass_index for r in saved.history] == [1]


class RestorePointWatcher(Pass2Worker):
    """After pass 2 pushed, waits for the checkpoint of pass 1 to be on storage, then checks
    that the checkpoint the saved record names still exists."""

    def __init__(self, ps: HeldPS, index: int, store: MemoryStateStore, ckpt: Path) -> None:
        super().__init__(ps, index, store)
        self.ckpt = ckpt
        self.restore_point_existed: bool | None = None

    async def run_pass(self, share: PassShare) -> Any:
        result = await super().run_pass(share)
        if share.pass_index == 2 and self.index == 0:
            written = self.ckpt / "pass-1-g1" / checkpoint.MANIFEST
            for _ in range(200):
                if written.exists():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # time enough for a prune that would come next
            recorded = self.store.load()
            assert recorded is not None and recorded.checkpoint is not None
            restore_point = Path(recorded.checkpoint.uri) / checkpoint.MANIFEST
            self.restore_point_existed = restore_point.exists()
        return result


def test_with_keep_1_the_recorded_restore_point_is_never_pruned_before_the_new_one_is_saved(
    tmp_path: Path,
) -> None:
    job = beside_job(tmp_path)
    job = dataclasses.replace(
        job,
        spec=dataclasses.replace(
            job.spec, checkpoint=dataclasses.replace(job.spec.checkpoint, keep=1)
        ),
    )
    ps = HeldPS(render.ps_config(job.spec), num_shards=2)
    store = MemoryStateStore()
    ckpt = tmp_path / "ckpt" / DAY
    workers = [RestorePointWatcher(ps, i, store, ckpt) for i in range(2)]
    progress = run(job, workers, ps, store)
    assert progress.phase == Phase.SUCCEEDED
    assert ps.written == [str(ckpt / "pass-1-g1")]
    # While pass 2 still ran, the checkpoint of pass 1 was written but not yet recorded:
    # the genesis the record named was still there.
    assert workers[0].restore_point_existed is True
    assert sorted(p.name for p in ckpt.iterdir()) == ["pass-2-g1"]


class LosingWorker(Pass2Worker):
    """Worker 1, in pass 2 of generation 1: after its pushes, PS shard 0 "restarts" empty
    (its held snapshot, the checkpoint being written, goes with it)."""

    def __init__(self, ps: HeldPS, index: int, store: MemoryStateStore) -> None:
        super().__init__(ps, index, store)
        self.losses = 0

    async def run_pass(self, share: PassShare) -> Any:
        result = await super().run_pass(share)
        if share.pass_index == 2 and share.generation == 1 and self.index == 1:
            self.ps.shards[0] = Shard(self.ps.config, 0, self.ps.num_shards)
            self.watch.ps_restarts += 1
            self.watch.last_ps_restart = "ps-0 exited with code -9"
            self.losses += 1
            raise ConnectionError("PS shard restarted")
        return result


def test_a_ps_loss_beside_a_checkpoint_reloads_the_one_before_and_trains_every_pass_once(
    tmp_path: Path,
) -> None:
    _, clean_ps = clean_run(tmp_path / "clean")
    job = beside_job(tmp_path / "beside")
    ps = HeldPS(render.ps_config(job.spec), num_shards=2)
    store = MemoryStateStore()
    workers = [Pass2Worker(ps, 0, store), LosingWorker(ps, 1, store)]
    workers[1].watch = workers[0].watch  # one restart watch, as LocalCluster is
    loads: list[str] = []

    def on_action(action: Action, progress: Progress) -> None:
        if isinstance(action, LoadCheckpoint):
            loads.append(action.uri)

    clock = iter(range(10_000))
    driver = Driver(
        job.spec,
        ps,
        workers,
        store,
        clock=lambda: float(next(clock)),
        sleep=no_sleep,
        restarts=workers[0].watch,
        observer=Observer(on_action=on_action),
    )
    progress = asyncio.run(driver.run())
    assert workers[1].losses == 1
    assert progress.phase == Phase.SUCCEEDED
    # The checkpoint of pass 1 was never recorded: the restore reloaded the genesis.
    assert loads == [str(tmp_path / "beside" / "ckpt" / DAY / "pass-0-g1")]
    assert [(r.pass_index, r.generation) for r in progress.history] == [(1, 1), (2, 2)]
    assert_same_model(ps, clean_ps)
