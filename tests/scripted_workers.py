"""Scripted workers over a real in-process PS, their data folders and the driver's run:
shared by the operator tests and the fault sweep of the storage path.

A root module of ``tests`` (on pytest's path), so neither folder imports the other's.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt

from streamtrain_operator.job.spec import Job
from streamtrain_operator.run.driver import Driver
from streamtrain_operator.run.state import MemoryStateStore
from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.shard import Shard
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.proto.share import PassShare


def write_folder(root: Path, day: str, hhmm: str, done: bool = True, parts: int = 3) -> None:
    """One split's folder under ``root/data``: ``parts`` part files, then its donefile."""
    folder = root / "data" / day / hhmm
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(parts):
        (folder / f"part-{i:05d}").write_text("x" * (10 + i))
    if done:
        (folder / "_SUCCESS").touch()


def file_keys(files: Sequence[str], per_file: int = 16) -> npt.NDArray[np.uint64]:
    """The keys a pass over ``files`` pushes, sorted; stable across processes (``hash`` of
    a str is not)."""
    names = (f"{Path(f).parent.name}/{Path(f).name}/{i}" for f in files for i in range(per_file))
    return np.array(sorted({zlib.crc32(n.encode()) for n in names}), dtype=np.uint64)


def pass_metrics(share: PassShare) -> PassMetrics:
    """What a worker reports for ``share``: one scored example per file."""
    m = PassMetrics(num_buckets=100)
    m.add(
        np.full(len(share.files), 0.3),
        np.arange(len(share.files)) % 2,
        np.full(len(share.files), 0.6),
    )
    return m


class FakeWorker:
    """Trains by pushing one key per file to the PS; answers like a real worker."""

    def __init__(self, ps: LocalPS, index: int, errors: list[str] | None = None) -> None:
        self.ps = ps
        self.name = f"worker-{index}"
        self.index = index
        self.errors = errors or []
        self.calls: list[tuple[str, int, tuple[str, ...], int]] = []
        self.stale = False

    async def run_pass(self, share: PassShare) -> Any:
        self.calls.append((share.day, share.pass_index, share.files, share.generation))
        if self.errors:
            raise ConnectionError(self.errors.pop(0))
        keys = np.array([hash(f) % 1000 for f in share.files], dtype=np.uint64)
        if share.train and keys.size:
            grads = np.zeros((keys.size, 3), dtype=np.float32)
            ones = np.ones(keys.size, dtype=np.float32)
            self.ps.push_sparse("embedding", SparsePush(keys, grads, ones, ones * 0))
        m = pass_metrics(share)
        m.seconds = 0.5
        gen = share.generation - 1 if self.stale else share.generation
        return m.to_proto(share.day, share.pass_index, gen)

    async def export_dense(self, uri: str, snapshot_id: str = "") -> list[str]:
        fs, path = fsspec.core.url_to_fs(uri, auto_mkdir=True)
        fs.pipe_file(f"{path}/dense.pt", b"scripted")
        return [f"{uri}/dense.pt"]

    async def reset(self, generation: int) -> None:
        return None


class FakeRestartWatch:
    """Counts restarts like ``LocalCluster`` (the dying worker bumps its own count)."""

    def __init__(self) -> None:
        self.ps_restarts = 0
        self.last_ps_restart = ""
        self.worker_restarts = 0
        self.last_worker_restart = ""

    async def heal(self) -> list[str]:
        return []


class DenseWorker(FakeWorker):
    """Like a real worker for the PS: its reset offers the initial dense vector (the
    trainer's ``init_dense``, first one wins) and a pass pushes sparse and dense gradients.

    ``lose_shard`` (shard index): during pass 1 of generation 1, after this worker's pushes,
    that PS shard "restarts" empty and the restart watch counts it — a PS loss before any
    regular checkpoint, with the other shard keeping the pass's pushes.
    """

    DENSE = "dnn"

    def __init__(
        self,
        ps: LocalPS,
        index: int,
        watch: FakeRestartWatch | None = None,
        lose_shard: int | None = None,
    ) -> None:
        super().__init__(ps, index)
        self.watch = watch or FakeRestartWatch()
        self.lose_shard = lose_shard
        self.resets = 0

    async def reset(self, generation: int) -> None:
        self.resets += 1
        self.ps.init_dense(self.DENSE, np.linspace(-1.0, 1.0, 4, dtype=np.float32))

    async def run_pass(self, share: PassShare) -> Any:
        self.calls.append((share.day, share.pass_index, share.files, share.generation))
        keys = file_keys(share.files)
        if share.train and keys.size:
            grads = np.full((keys.size, 3), 0.25 * (self.index + 1), dtype=np.float32)
            ones = np.ones(keys.size, dtype=np.float32)
            self.ps.push_sparse(
                "embedding", SparsePush(keys, grads, ones, ones * (share.pass_index % 2))
            )
            self.ps.push_dense(self.DENSE, np.full(4, 0.5 * share.pass_index, dtype=np.float32))
        if self.lose_shard is not None and share.pass_index == 1 and share.generation == 1:
            i = self.lose_shard
            self.ps.shards[i] = Shard(self.ps.config, i, self.ps.num_shards)
            self.watch.ps_restarts += 1
            self.watch.last_ps_restart = f"ps-{i} exited with code -9"
            raise ConnectionError("PS shard restarted")
        return pass_metrics(share).to_proto(share.day, share.pass_index, share.generation)


async def no_sleep(seconds: float) -> None:
    return None


def run(job: Job, workers: Sequence[FakeWorker], ps: LocalPS, store: MemoryStateStore) -> Any:
    """The driver over ``workers`` to the end of ``job``, on a clock of one second a call."""
    clock = iter(range(100_000))
    driver = Driver(job.spec, ps, workers, store, clock=lambda: float(next(clock)), sleep=no_sleep)
    return asyncio.run(driver.run())
