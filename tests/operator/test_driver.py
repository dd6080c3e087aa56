"""The driver against the real in-process PS (LocalPS) and scripted workers: no network."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import shutil
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fsspec
import grpc
import numpy as np
import pytest
from fakes import MANIFEST, make_job

from scripted_workers import (
    DenseWorker,
    FakeRestartWatch,
    FakeWorker,
    file_keys,
    no_sleep,
    run,
    write_folder,
)
from streamtrain_operator.job import render
from streamtrain_operator.job.messages import Action, LoadCheckpoint
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import Job, parse_job
from streamtrain_operator.run.driver import Driver, Observer
from streamtrain_operator.run.export import read_donefile, verify_model
from streamtrain_operator.run.hooks import BEFORE, MANIFEST_POINT
from streamtrain_operator.run.state import MemoryStateStore
from streamtrain_ps import sharding
from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.errors import MemoryLimitError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.saves.checkpoint import read_sparse
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.proto.share import PassShare
from streamtrain_worker.publishing import model_folder
from streamtrain_worker.publishing.predict import apply_chain, model_chain


def test_a_day_runs_assigns_every_file_once_and_publishes_everything(tmp_path: Path) -> None:
    job = make_job(tmp_path, keep=1)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    workers = [FakeWorker(ps, 0), FakeWorker(ps, 1)]
    progress = run(job, workers, ps, MemoryStateStore())
    assert progress.phase == Phase.SUCCEEDED
    for p, hhmm in ((1, "0000"), (2, "1200")):
        shares = [c[2] for w in workers for c in w.calls if c[1] == p]
        files = sorted(f for share in shares for f in share)
        assert files == sorted(str(f) for f in (tmp_path / "data/20261101" / hhmm).glob("part-*"))
    record = progress.history[0]
    assert record.metrics["examples"] == 3.0  # merged over both workers' histograms
    assert [d.key for d in read_donefile(str(tmp_path / "export"))] == [
        "20261101/delta-1",
        "20261101/delta-2",
        "20261102/base",
        "20261101/batch",
    ]
    manifest = verify_model(str(tmp_path / "export"), "20261101/delta-2")
    assert manifest.serving is not None
    assert manifest.serving.data["format"] == "criteo" and manifest.serving.table == "embedding"
    # keep: 1 — the older checkpoint was pruned, the newest is the one recorded.
    kept = sorted(p.parent.name for p in (tmp_path / "ckpt").glob("*/*/MANIFEST.json"))
    assert kept == ["pass-2-g1"]
    assert progress.checkpoint is not None
    assert Path(progress.checkpoint.uri, "MANIFEST.json").exists()


def test_skipped_names_are_counted_in_the_pass_record_and_recorded(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    folder = tmp_path / "data" / "20261101" / "0000"
    for name in (".part-00000.crc", "_started", "part-00009.tmp"):
        (folder / name).write_text("not data")
    (folder / "nested").mkdir()
    (folder / "nested" / "part-00000").write_text("not read either")
    ps = LocalPS(render.ps_config(job.spec))
    workers = [FakeWorker(ps, 0), FakeWorker(ps, 1)]
    progress = run(job, workers, ps, MemoryStateStore())
    assert progress.phase == Phase.SUCCEEDED
    assert [r.metrics["skippedFiles"] for r in progress.history] == [4, 0]
    trained = sorted(f for w in workers for c in w.calls if c[1] == 1 for f in c[2])
    assert trained == [str(folder / f"part-{i:05d}") for i in range(3)]
    record = json.loads((tmp_path / "ckpt" / "_passes" / "20261101" / "pass-1.json").read_text())
    assert record["skipped"] == [
        f"{folder}/{name}" for name in (".part-00000.crc", "_started", "nested/", "part-00009.tmp")
    ]
    assert [f["size"] for f in record["files"]] == [10, 11, 12]


def test_a_replay_scratch_left_by_a_kill_is_removed_when_a_driver_starts(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    leftover = tmp_path / "ckpt" / "_scratch" / "g2-20261101-1-delta" / "data-s000-x"
    leftover.mkdir(parents=True)
    (leftover / "part-00000.bin").write_bytes(b"half a save")
    ps = LocalPS(render.ps_config(job.spec))
    progress = run(job, [FakeWorker(ps, 0), FakeWorker(ps, 1)], ps, MemoryStateStore())
    assert progress.phase == Phase.SUCCEEDED
    assert not (tmp_path / "ckpt" / "_scratch").exists()


def test_a_stale_generation_result_is_refused_and_the_pass_restored(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    stale = FakeWorker(ps, 1)
    stale.stale = True
    progress = run(job, [FakeWorker(ps, 0), stale], ps, MemoryStateStore())
    # The worker ran the share (it may have pushed): a restore (generation 2), not a share
    # retry; passRetries (1) restores, then the job fails.
    assert progress.phase == Phase.FAILED
    assert "worker 1 failed pass 20261101/1 after 2 attempts" in progress.message
    assert "generation 1, expected 2" in progress.message
    assert [c[3] for c in stale.calls] == [1, 2]


def test_a_worker_error_restores_once_then_the_pass_completes(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    flaky = FakeWorker(ps, 1, errors=["socket closed"])
    steady = FakeWorker(ps, 0)
    progress = run(job, [steady, flaky], ps, MemoryStateStore())
    assert progress.phase == Phase.SUCCEEDED
    # Both workers redo pass 1 after the reload of the genesis (generation 2).
    assert [c[1] for c in flaky.calls] == [1, 1, 2]
    assert [(c[1], c[3]) for c in steady.calls] == [(1, 1), (1, 2), (2, 2)]
    assert progress.history[0].attempts == 2
    restored = progress.condition("Restored")
    assert restored is not None and restored.reason == "ShareFailed"


def test_missing_donefile_past_the_deadline_fails_naming_the_folder(tmp_path: Path) -> None:
    job = make_job(tmp_path, onMissing="fail")
    write_folder(tmp_path, "20261101", "0000")
    write_folder(tmp_path, "20261101", "1200", done=False)
    ps = LocalPS(render.ps_config(job.spec))
    progress = run(job, [FakeWorker(ps, 0), FakeWorker(ps, 1)], ps, MemoryStateStore())
    assert progress.phase == Phase.FAILED
    assert str(tmp_path / "data/20261101/1200") in progress.message


def test_restart_reloads_the_checkpoint_and_replays_a_published_export(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    store = MemoryStateStore()
    run(job, [FakeWorker(ps, 0), FakeWorker(ps, 1)], ps, store)
    # The crash came while recording the delta of pass 2, after it was published.
    crashed = next(
        p for p in store.saved if p.current is not None and str(p.current) == "20261101/2/delta"
    )
    fresh_ps = LocalPS(render.ps_config(job.spec))
    workers = [FakeWorker(fresh_ps, 0), FakeWorker(fresh_ps, 1)]
    second = MemoryStateStore(crashed)
    progress = run(job, workers, fresh_ps, second)
    assert progress.phase == Phase.SUCCEEDED
    assert progress.generation == 2
    assert any(p.phase == Phase.RESTORING for p in second.saved)
    assert progress.replayed_steps == 1  # train of pass 2, after the checkpoint of pass 1
    assert [c[1] for c in workers[0].calls] == [2]  # pass 2 replayed once, nothing else
    keys = [d.key for d in read_donefile(str(tmp_path / "export"))]
    assert len(keys) == len(set(keys)) == 4  # the delta was not published twice
    assert not (tmp_path / "ckpt" / "_scratch").exists() or not any(
        (tmp_path / "ckpt" / "_scratch").iterdir()
    )


@pytest.mark.parametrize("change", ["purged", "rewritten"])
def test_a_replay_over_changed_data_stops_with_data_changed(tmp_path: Path, change: str) -> None:
    """Pass 2 was trained from folder 1200 and the record is now replayed (the crash came
    while its delta was recorded). Its folder was purged, or a file rewritten, in between:
    the job stops with ``DataChanged`` naming the folder, and no worker trains anything."""
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    store = MemoryStateStore()
    run(job, [FakeWorker(ps, 0), FakeWorker(ps, 1)], ps, store)
    crashed = next(
        p for p in store.saved if p.current is not None and str(p.current) == "20261101/2/delta"
    )
    folder = tmp_path / "data" / "20261101" / "1200"
    if change == "purged":
        shutil.rmtree(folder)
    else:
        (folder / "part-00001").write_text("y" * 11)  # same size, new mtime
        os.utime(folder / "part-00001", (1, 1))
    fresh_ps = LocalPS(render.ps_config(job.spec))
    workers = [FakeWorker(fresh_ps, 0), FakeWorker(fresh_ps, 1)]
    progress = run(job, workers, fresh_ps, MemoryStateStore(crashed))
    assert progress.phase == Phase.FAILED
    failed = progress.condition("Failed")
    assert failed is not None and failed.reason == "DataChanged"
    assert f"pass 20261101/2: the data in {folder} changed" in failed.message
    what = "is gone" if change == "purged" else "changed (version"
    assert f"{folder}/part-00001 {what}" in failed.message
    assert "_passes/20261101/pass-2.json" in failed.message
    assert all(not w.calls for w in workers)


@pytest.mark.parametrize("replicas", [1, 3])
def test_worker_count_must_match_the_spec(tmp_path: Path, replicas: int) -> None:
    job = make_job(tmp_path)
    ps = LocalPS(render.ps_config(job.spec))
    with pytest.raises(ValueError, match=r"spec\.workers\.replicas=2"):
        Driver(job.spec, ps, [FakeWorker(ps, i) for i in range(replicas)], MemoryStateStore())


def test_an_unforeseen_error_becomes_a_failed_condition_not_a_crash(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    write_folder(tmp_path, "20261101", "0000")
    ps = LocalPS(render.ps_config(job.spec))
    driver = Driver(
        job.spec, ps, [FakeWorker(ps, 0), FakeWorker(ps, 1)], MemoryStateStore(), sleep=no_sleep
    )

    def broken(key: Any) -> Any:  # what assign_files raises for a listing with duplicates
        raise ValueError("duplicate files in the listing")

    driver._assignment = broken  # type: ignore[method-assign]
    progress = asyncio.run(driver.run())
    assert progress.phase == Phase.FAILED
    assert "InternalError" in progress.message
    assert "ValueError: duplicate files in the listing" in progress.message


class MemoryRefusal(grpc.RpcError):
    """A worker's RunPass ended by a PS memory-limit refusal (``control/service.py`` forwards the
    PS's trailing metadata)."""

    def __init__(self, exc: MemoryLimitError) -> None:
        assert exc.working_set is not None
        self.metadata = exc.working_set.metadata()

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return "RunPass(...): MemoryLimitError: ..."

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


class WideWorker(FakeWorker):
    """Pushes 5,000 new keys at once, as a real worker would, turning the PS's refusal into
    the worker's status."""

    async def run_pass(self, share: PassShare) -> Any:
        self.calls.append((share.day, share.pass_index, share.files, share.generation))
        n = 5_000
        keys = np.arange(1, n + 1, dtype=np.uint64) + 10**6 * self.index
        ones = np.ones(n, dtype=np.float32)
        try:
            self.ps.push_sparse(
                "embedding", SparsePush(keys, np.zeros((n, 3), np.float32), ones, ones * 0)
            )
        except MemoryLimitError as exc:
            raise MemoryRefusal(exc) from exc
        return await super().run_pass(share)


def test_a_memory_limit_too_small_for_a_pass_fails_the_job_at_once(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    write_folder(tmp_path, "20261101", "0000")
    config = dataclasses.replace(render.ps_config(job.spec), memoryLimit=64_000)
    ps = LocalPS(config)
    workers = [WideWorker(ps, 0), WideWorker(ps, 1)]
    store = MemoryStateStore()
    progress = run(job, workers, ps, store)
    assert progress.phase == Phase.FAILED
    failed = progress.condition("Failed")
    assert failed is not None and failed.reason == "MemoryLimitTooSmall"
    assert failed.message.startswith("pass 20261101/1: spec.ps.memoryLimit (64000 bytes)")
    assert (
        "5000 unique keys" in failed.message
        and "Set spec.ps.memoryLimit to at least" in failed.message
    )
    # terminal: no share retry, no restore and replay (passRetries is 1)
    assert [len(w.calls) for w in workers] == [1, 1]


class DyingWorker(FakeWorker):
    """Pushes half of its share, then "dies": the restart watch restarts it (counts it)."""

    def __init__(self, ps: LocalPS, index: int, watch: FakeRestartWatch, deaths: int) -> None:
        super().__init__(ps, index)
        self.watch = watch
        self.deaths = deaths

    async def run_pass(self, share: PassShare) -> Any:
        if share.pass_index == 2 and share.train and self.deaths > 0:
            self.deaths -= 1
            half = share.files[: len(share.files) // 2 + 1]
            await super().run_pass(dataclasses.replace(share, files=half))
            self.watch.worker_restarts += 1
            self.watch.last_worker_restart = f"{self.name} exited with code -9"
            raise ConnectionError("worker died")
        return await super().run_pass(share)


@pytest.mark.parametrize(("deaths", "phase"), [(1, Phase.SUCCEEDED), (3, Phase.FAILED)])
def test_a_worker_dying_mid_pass_restores_the_checkpoint_at_most_pass_retries_times(
    tmp_path: Path, deaths: int, phase: str
) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    watch = FakeRestartWatch()
    dying = DyingWorker(ps, 1, watch, deaths)
    clock = iter(range(10_000))
    driver = Driver(
        job.spec,
        ps,
        [FakeWorker(ps, 0), dying],
        MemoryStateStore(),
        clock=lambda: float(next(clock)),
        sleep=no_sleep,
        restarts=watch,
    )
    progress = asyncio.run(driver.run())
    assert progress.phase == phase
    restored = progress.condition("Restored")
    assert restored is not None and restored.reason == "ShareFailed"
    assert "worker 1 failed pass 20261101/2 after it may have pushed" in restored.message
    pass2 = [c for c in dying.calls if c[1] == 2]
    # One restore (generation 2: reload pass 1's checkpoint, redo pass 2), no share retry;
    # a second death exhausts passRetries (1) and fails the job.
    assert [c[3] for c in pass2] == [1, 2] and progress.generation == 2
    if deaths == 1:
        assert progress.history[1].attempts == 2
    else:
        assert "worker 1 failed pass 20261101/2 after 2 attempts" in progress.message


def _dense_run(
    root: Path,
    make_workers: Callable[[LocalPS, FakeRestartWatch], list[DenseWorker]],
    supervised: bool = True,
    **workers_spec: Any,
) -> tuple[Progress, LocalPS, list[DenseWorker], list[str], list[str]]:
    """A one-day job of two passes on two PS shards: its progress, PS, workers, files and
    the checkpoints it loaded."""
    job = make_job(root, workers=workers_spec)
    for hhmm in ("0000", "1200"):
        write_folder(root, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec), num_shards=2)
    watch = FakeRestartWatch()
    workers = make_workers(ps, watch)
    clock = iter(range(10_000))
    loads: list[str] = []

    def on_action(action: Action, progress: Progress) -> None:
        if isinstance(action, LoadCheckpoint):
            loads.append(action.uri)

    driver = Driver(
        job.spec,
        ps,
        workers,
        MemoryStateStore(),
        clock=lambda: float(next(clock)),
        sleep=no_sleep,
        restarts=watch if supervised else None,
        observer=Observer(on_action=on_action),
    )
    files = [str(f) for f in sorted((root / "data").glob("*/*/part-*"))]
    return asyncio.run(driver.run()), ps, workers, files, loads


def _two_shard_run(
    root: Path, lose_shard: int | None
) -> tuple[Progress, LocalPS, list[DenseWorker], list[str], list[str]]:
    return _dense_run(
        root, lambda ps, sup: [DenseWorker(ps, 0, sup), DenseWorker(ps, 1, sup, lose_shard)]
    )


def _assert_same_model(ps: LocalPS, clean: LocalPS, files: list[str]) -> None:
    """Every key's row (show, click, weights) and the dense vector equal a clean run's."""
    keys = file_keys(files)
    # Pulled rows are [show, click, embed_w, embedx...].
    got, want = ps.pull_sparse("embedding", keys), clean.pull_sparse("embedding", keys)
    assert np.array_equal(got[:, 0], want[:, 0]), "show counts differ from a clean run"
    assert np.array_equal(got[:, 1], want[:, 1]), "click counts differ from a clean run"
    assert np.array_equal(got, want)
    assert np.array_equal(ps.pull_dense(DenseWorker.DENSE), clean.pull_dense(DenseWorker.DENSE))


class PushThenFailWorker(DenseWorker):
    """Trains and pushes its whole share of pass 2, then fails once (as the trainer does:
    it flushes its queued pushes before re-raising)."""

    failures = 1

    async def run_pass(self, share: PassShare) -> Any:
        result = await super().run_pass(share)
        if share.pass_index == 2 and share.train and self.failures:
            self.failures -= 1
            raise ConnectionError("failed after its pushes")
        return result


def test_a_share_failing_after_its_pushes_is_applied_once(tmp_path: Path) -> None:
    """No restart watch, no restart: the worker stays up and reports an error after pushing.
    Retrying its share alone would double its keys' show counts; the pass is redone on the
    reloaded checkpoint instead, and the model equals a clean run's key by key."""
    clean, clean_ps, _, files, _ = _two_shard_run(tmp_path / "clean", None)
    progress, ps, workers, _, loads = _dense_run(
        tmp_path / "failing",
        lambda ps, sup: [DenseWorker(ps, 0, sup), PushThenFailWorker(ps, 1, sup)],
        supervised=False,
    )
    assert clean.phase == progress.phase == Phase.SUCCEEDED
    _assert_same_model(ps, clean_ps, files)
    assert loads == [str(tmp_path / "failing" / "ckpt" / "20261101" / "pass-1-g1")]
    assert [(c[1], c[3]) for c in workers[1].calls] == [(1, 1), (2, 1), (2, 2)]
    assert progress.history[1].attempts == 2


class HangingWorker(DenseWorker):
    """Pass 2 of generation 1 never answers, and the worker keeps pushing after the call
    is cancelled (a worker finishes what it started) until a ``Reset`` of a newer
    generation cancels it — as ``control/service.py`` does."""

    PUSHES = 500  # 5 s of pushes at most: the test never hangs, even when nothing resets

    def __init__(self, ps: LocalPS, index: int, watch: FakeRestartWatch) -> None:
        super().__init__(ps, index, watch)
        self.background: asyncio.Task[None] | None = None
        self.cancelled = False
        self.pushes = 0

    async def run_pass(self, share: PassShare) -> Any:
        if share.pass_index == 2 and share.generation == 1 and self.background is None:
            self.background = asyncio.create_task(self._keep_pushing(share.files))
            await asyncio.sleep(3600)  # cancelled by passTimeoutSeconds
        return await super().run_pass(share)

    async def _keep_pushing(self, files: Sequence[str]) -> None:
        keys = file_keys(files)
        ones = np.ones(keys.size, dtype=np.float32)
        grads = np.full((keys.size, 3), 0.1, dtype=np.float32)
        while not self.cancelled and self.pushes < self.PUSHES:
            self.ps.push_sparse("embedding", SparsePush(keys, grads, ones, ones * 0))
            self.pushes += 1
            await asyncio.sleep(0.01)

    async def reset(self, generation: int) -> None:
        if self.background is not None and generation > 1:
            self.cancelled = True
            await self.background  # the pass ends (pushes flushed) before Reset answers
        await super().reset(generation)


def test_a_pass_timeout_cancels_the_still_pushing_worker_before_the_reload(
    tmp_path: Path,
) -> None:
    clean, clean_ps, _, files, _ = _two_shard_run(tmp_path / "clean", None)
    progress, ps, workers, _, loads = _dense_run(
        tmp_path / "slow",
        lambda ps, sup: [DenseWorker(ps, 0, sup), HangingWorker(ps, 1, sup)],
        passTimeoutSeconds=0.3,
    )
    assert clean.phase == progress.phase == Phase.SUCCEEDED
    slow = workers[1]
    assert isinstance(slow, HangingWorker)
    # It was still pushing when the timeout fired; the reload's Reset stopped it.
    assert slow.cancelled and 0 < slow.pushes < HangingWorker.PUSHES
    assert loads == [str(tmp_path / "slow" / "ckpt" / "20261101" / "pass-1-g1")]
    restored = progress.condition("Restored")
    assert restored is not None and "no answer within passTimeoutSeconds" in restored.message
    _assert_same_model(ps, clean_ps, files)


def test_a_ps_loss_before_the_first_checkpoint_reloads_the_genesis_exactly_once(
    tmp_path: Path,
) -> None:
    """Two shards; the one holding the dense vector is lost during pass 1, before any
    regular checkpoint. The other shard still holds pass 1's pushes: without the genesis
    checkpoint the redone pass would land on top of them. The final model must equal an
    uninterrupted run's, key by key and for the dense vector."""
    clean, clean_ps, _, files, clean_loads = _two_shard_run(tmp_path / "clean", None)
    lost = sharding.server_of_dense(DenseWorker.DENSE, 2)
    progress, ps, workers, _, loads = _two_shard_run(tmp_path / "lost", lost)
    assert clean.phase == progress.phase == Phase.SUCCEEDED
    restored = progress.condition("Restored")
    assert restored is not None and restored.reason == "PSRestarted"
    assert f"ps-{lost} exited with code -9" in restored.message
    assert clean_loads == []
    assert loads == [str(tmp_path / "lost" / "ckpt" / "20261101" / "pass-0-g1")]
    # Generation 1 trained pass 1 and lost it; generation 2 reloaded the genesis and redid it.
    assert [(c[1], c[3]) for c in workers[1].calls] == [(1, 1), (1, 2), (2, 2)]
    assert progress.generation == 2 and progress.replayed_steps == 0
    # The opening reset, the wait for idle workers before the reload, the one after it.
    assert workers[0].resets == 3
    # Both shards had pass-1 keys (the surviving one would have trained them twice).
    keys = file_keys(files)
    servers = sharding.server_of_key(keys, ps.config.logicalShards, 2)
    assert set(servers.tolist()) == {0, 1}
    assert np.array_equal(
        ps.pull_sparse("embedding", keys), clean_ps.pull_sparse("embedding", keys)
    )
    assert np.array_equal(ps.pull_dense(DenseWorker.DENSE), clean_ps.pull_dense(DenseWorker.DENSE))
    assert ps.stats() == clean_ps.stats()


class HoldPublication:
    """A step hook that holds the end of delta-1's publication (``MODEL.json`` written, the
    donefile line not) until pass 2 has been dispatched, or fails it there once."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.pass_2_started = asyncio.Event()
        self.held = 0

    async def hold(self, point: str, key: StepKey) -> None:
        if point != MANIFEST_POINT or (key.pass_index, key.kind) != (1, StepKind.DELTA):
            return
        self.held += 1
        if self.fail and self.held == 1:
            raise OSError("the donefile's store is down")
        await asyncio.wait_for(self.pass_2_started.wait(), 30)


class SignallingWorker(FakeWorker):
    def __init__(self, ps: LocalPS, index: int, hook: HoldPublication) -> None:
        super().__init__(ps, index)
        self.hook = hook

    async def run_pass(self, share: PassShare) -> Any:
        if share.pass_index == 2:
            self.hook.pass_2_started.set()
        return await super().run_pass(share)


def _publication_job(tmp_path: Path) -> Job:
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    m = copy.deepcopy(MANIFEST)
    # Checkpoints only at the day end, so delta-1 is followed by pass 2, not a checkpoint.
    m["spec"]["checkpoint"]["everyPasses"] = 2
    for section in ("data", "checkpoint", "export"):
        m["spec"][section]["path"] = str(tmp_path / m["spec"][section]["path"])
    return parse_job(m)


DAY_MODELS = ["20261101/delta-1", "20261101/delta-2", "20261102/base", "20261101/batch"]


def test_the_end_of_a_publication_runs_beside_the_next_pass(tmp_path: Path) -> None:
    # The hook holds delta-1's donefile line until pass 2 is dispatched: a driver that
    # published before training on would wait for itself (and time out).
    job = _publication_job(tmp_path)
    ps = LocalPS(render.ps_config(job.spec))
    hook = HoldPublication()
    workers = [SignallingWorker(ps, i, hook) for i in range(2)]
    clock = iter(range(10_000))
    driver = Driver(
        job.spec,
        ps,
        workers,
        MemoryStateStore(),
        clock=lambda: float(next(clock)),
        sleep=no_sleep,
        step_hook=hook,
    )
    progress = asyncio.run(driver.run())
    assert progress.phase == Phase.SUCCEEDED
    assert hook.pass_2_started.is_set()
    # Donefile lines stay in step order, each model complete.
    export = str(tmp_path / "export")
    assert [d.key for d in read_donefile(export)] == DAY_MODELS
    for key in DAY_MODELS:
        verify_model(export, key)


def test_a_publication_failing_beside_the_next_pass_fails_the_job_and_the_rerun_publishes_it(
    tmp_path: Path,
) -> None:
    job = _publication_job(tmp_path)
    ps = LocalPS(render.ps_config(job.spec))
    hook = HoldPublication(fail=True)
    workers = [SignallingWorker(ps, i, hook) for i in range(2)]
    store = MemoryStateStore()
    clock = iter(range(10_000))

    def driver() -> Driver:
        return Driver(
            job.spec,
            ps,
            workers,
            store,
            clock=lambda: float(next(clock)),
            sleep=no_sleep,
            step_hook=hook,
        )

    failed = asyncio.run(driver().run())
    assert failed.phase == Phase.FAILED
    assert "ExportFailed" in failed.message and "delta-1" in failed.message
    # delta-1 is recorded but has no donefile line: nothing is visible.
    assert read_donefile(str(tmp_path / "export")) == []

    # The rerun reloads the genesis, replays pass 1 and delta-1 — publishing it, since it
    # never was — and goes on; every pass is recorded once, every model published once.
    progress = asyncio.run(driver().run())
    assert progress.phase == Phase.SUCCEEDED
    assert [(r.day, r.pass_index) for r in progress.history] == [("20261101", 1), ("20261101", 2)]
    export = str(tmp_path / "export")
    assert [d.key for d in read_donefile(export)] == DAY_MODELS
    assert verify_model(export, "20261101/delta-1").pass_index == 1


class KilledError(Exception):
    """The kill model of these tests: raised by a store's write, it aborts the run there."""


class KilledAtRecord(MemoryStateStore):
    """A state store whose first write naming a checkpoint of ``pass_index`` as the restore
    point never happens: the process dies just before it (what it holds stays durable)."""

    def __init__(self, pass_index: int) -> None:
        super().__init__()
        self.pass_index = pass_index

    def save(self, progress: Progress) -> None:
        ckpt = progress.checkpoint
        if ckpt is not None and ckpt.key.pass_index == self.pass_index:
            raise KilledError(f"killed before the record naming {ckpt.uri}")
        super().save(progress)


def test_keep_1_a_kill_before_the_record_naming_a_new_checkpoint_still_restarts(
    tmp_path: Path,
) -> None:
    """Bug: the checkpoint written in the path pruned the one before as soon as it was
    published, while the durable record still named that one: with ``keep: 1`` a kill in
    between left every restart ``RestoreFailed: .../pass-0-g1: MANIFEST.json: missing``."""
    job = make_job(tmp_path, keep=1)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, "20261101", hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    store = KilledAtRecord(pass_index=1)
    with pytest.raises(KilledError):
        run(job, [FakeWorker(ps, 0), FakeWorker(ps, 1)], ps, store)
    durable = store.load()
    assert durable is not None and durable.checkpoint is not None
    assert durable.checkpoint.key.pass_index == 0  # the record still names the genesis
    assert Path(durable.checkpoint.uri, "MANIFEST.json").exists()

    fresh_ps = LocalPS(render.ps_config(job.spec))
    workers = [FakeWorker(fresh_ps, 0), FakeWorker(fresh_ps, 1)]
    progress = run(job, workers, fresh_ps, MemoryStateStore(durable))
    assert progress.phase == Phase.SUCCEEDED, progress.message
    # Pass 1 recorded once (by the killed run), replayed once from the genesis; pass 2 once.
    assert [(r.pass_index, r.generation) for r in progress.history] == [(1, 1), (2, 2)]
    assert [c[1] for c in workers[0].calls] == [1, 2]
    kept = sorted(p.parent.name for p in (tmp_path / "ckpt").glob("*/*/MANIFEST.json"))
    assert kept == ["pass-2-g2"]


class DayWorker(FakeWorker):
    """Pushes a few keys per file, keyed by the file's whole path: every day's keys differ,
    so a key trained on day 1 is not touched on day 2."""

    async def run_pass(self, share: PassShare) -> Any:
        self.calls.append((share.day, share.pass_index, share.files, share.generation))
        keys = np.array(sorted({_path_key(f, i) for f in share.files for i in range(4)}), np.uint64)
        if share.train and keys.size:
            grads = np.full((keys.size, 3), 0.25, dtype=np.float32)
            ones = np.ones(keys.size, dtype=np.float32)
            self.ps.push_sparse(
                "embedding", SparsePush(keys, grads, ones, ones * (share.pass_index % 2))
            )
        m = PassMetrics(num_buckets=100)
        m.add(
            np.full(len(share.files), 0.3),
            np.arange(len(share.files)) % 2,
            np.full(len(share.files), 0.6),
        )
        return m.to_proto(share.day, share.pass_index, share.generation)


def _path_key(path: str, i: int) -> int:
    return zlib.crc32(f"{path}/{i}".encode())


class CaptureBefore:
    """Step hook: before ``key`` runs, pulls ``keys`` from the PS (the model at that step)."""

    def __init__(self, ps: LocalPS, key: str, keys: np.ndarray) -> None:
        self.ps, self.key, self.keys = ps, key, keys
        self.rows: np.ndarray | None = None

    async def hold(self, point: str, key: StepKey) -> None:
        if point == BEFORE and str(key) == self.key:
            self.rows = self.ps.pull_sparse("embedding", self.keys)


def _two_days(root: Path, base: bool) -> tuple[str, np.ndarray, CaptureBefore]:
    """A two-day job of two passes a day whose day-1 shrink evicts some keys (so day 2's
    first delta carries tombstones): its export root, every key trained, and the rows the
    PS held before day 2's shrink (after its last delta)."""
    job = make_job(root, export={"base": base}, endDay="20261102")
    for day in ("20261101", "20261102"):
        for hhmm in ("0000", "1200"):
            write_folder(root, day, hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    files = [str(f) for f in sorted((root / "data").glob("*/*/part-*"))]
    keys = np.array(sorted({_path_key(f, i) for f in files for i in range(4)}), np.uint64)
    capture = CaptureBefore(ps, "20261102/2/shrink", keys)
    clock = iter(range(10_000))
    driver = Driver(
        job.spec,
        ps,
        [DayWorker(ps, 0), DayWorker(ps, 1)],
        MemoryStateStore(),
        clock=lambda: float(next(clock)),
        sleep=no_sleep,
        step_hook=capture,
    )
    assert asyncio.run(driver.run()).phase == Phase.SUCCEEDED
    assert capture.rows is not None
    return str(root / "export"), keys, capture


@pytest.mark.parametrize("base", [False, True])
def test_a_delta_serves_every_earlier_day_with_or_without_bases(tmp_path: Path, base: bool) -> None:
    """Bug: with ``export.base: false`` every delta was published with ``base: null`` and
    the predictor's chain kept only the deltas of the target's day, so every key not
    touched on day 2 vanished from the served model. Served at day 2's last delta (before
    the day-end shrink), the chain must give every key the row the PS held then."""
    root, keys, capture = _two_days(tmp_path, base)
    assert capture.rows is not None
    chain = [d.key for d in model_chain(root, "20261102/delta-2")]
    if base:
        assert chain == ["20261102/base", "20261102/delta-1", "20261102/delta-2"]
    else:
        assert chain == [f"{d}/delta-{p}" for d in ("20261101", "20261102") for p in (1, 2)]
    served = apply_chain([read_sparse(f"{root}/{k}/sparse", "embedding") for k in chain], 5)
    assert np.array_equal(served.pull_sparse("embedding", keys), capture.rows)
    # Every key the PS held (the day-1 shrink evicted some) is served, day 1's included.
    held = keys[capture.rows[:, 0] > 0]
    assert np.array_equal(served.keys, held)
    day_1 = [
        _path_key(str(f), i) for f in tmp_path.glob("data/20261101/*/part-*") for i in range(4)
    ]
    assert np.isin(held, day_1).any(), "no key of day 1 survived its shrink: nothing tested"


@pytest.mark.parametrize("base", [False, True])
def test_every_model_json_counts_what_its_save_holds(tmp_path: Path, base: bool) -> None:
    """``MODEL.json``'s ``keys``, ``tombstones`` and ``saveMode`` are the save's own: a
    reader sizing or checking a model from the manifest must not be told another story.
    Without bases, day 2's first delta carries the tombstones of day 1's shrink (a base
    taken after the shrink would leave the evicted keys out instead)."""
    root, _, _ = _two_days(tmp_path, base)
    fs, path = fsspec.core.url_to_fs(root)
    models = read_donefile(root)
    kinds = {"delta", "base", "batch"} if base else {"delta", "batch"}
    assert {d.kind.value for d in models} == kinds
    tombstoned = 0
    for line in models:
        manifest = model_folder.read_manifest(fs, path, line.key)
        keys, _, tombstones = read_sparse(f"{root}/{line.key}/sparse", "embedding")
        sparse = checkpoint.read_manifest(f"{root}/{line.key}/sparse")
        assert (manifest.keys, manifest.tombstones) == (keys.size, tombstones.size), line.key
        assert manifest.save_mode == int(sparse.mode), line.key
        tombstoned += tombstones.size
    if not base:
        assert tombstoned > 0, "no model carried a tombstone: the count was not tested"
