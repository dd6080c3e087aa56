"""Reading the next pass ahead: the worker control server for real (gRPC on 127.0.0.1:0, an
in-process PS), Criteo rows as data. What a RunPass trains never depends on the hint."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from streamtrain_ps.client.local import LocalPS
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.service import WorkerServer, WorkerServicer
from streamtrain_worker.data.reader import PassReader
from streamtrain_worker.monitoring import WorkerMetrics
from streamtrain_worker.proto import worker_pb2, worker_pb2_grpc
from streamtrain_worker.training.read_ahead import Outcome, ReadAhead

CRITEO = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"
CONFIG = {
    "data": {"format": "criteo", "maxBadLineFraction": 0.01},
    "model": {"hiddenUnits": [16, 8], "batchSize": 128, "denseSyncSteps": 2},
    "metrics": {"numBuckets": 1024},
    "ps": {"config": {"logicalShards": 8}},
    # In order, so that two runs over the same data are bitwise identical.
    "runtime": {"overlap": False},
}


@dataclass
class Worker:
    servicer: WorkerServicer
    stub: worker_pb2_grpc.WorkerStub
    registry: CollectorRegistry

    def run(self, files: list[Path], next_files: list[Path] = ()) -> worker_pb2.PassResult:  # type: ignore[assignment]
        request = worker_pb2.RunPassRequest(
            day="20261101",
            pass_index=1,
            files=[str(f) for f in files],
            next_files=[str(f) for f in next_files],
            generation=1,
            train=True,
        )
        return self.stub.RunPass(request, timeout=60)

    def outcomes(self) -> dict[str, float]:
        return {
            o.value: self.registry.get_sample_value(
                "streamtrain_worker_read_ahead_total", {"outcome": o.value}
            )
            or 0.0
            for o in Outcome
        }


@pytest.fixture
def worker() -> Iterator[Worker]:
    yield from _worker()


def _worker() -> Iterator[Worker]:
    config = WorkerConfig.from_dict(CONFIG)
    registry = CollectorRegistry()
    servicer = WorkerServicer(config, LocalPS(config.ps.config), monitoring=WorkerMetrics(registry))
    server = WorkerServer(servicer)
    server.start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield Worker(servicer, worker_pb2_grpc.WorkerStub(channel), registry)
    finally:
        channel.close()
        server.close(grace=0)


def write_rows(path: Path, start: int, count: int) -> Path:
    lines = CRITEO.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[start : start + count]))
    return path


def readers_alive(within: float = 10.0) -> int:
    """Reader threads still running once ``within`` seconds passed (or none are left): a
    closed reader's thread ends at its next poll, and other tests' may still be ending."""
    deadline = time.monotonic() + within
    while True:
        alive = sum(t.name == "pass-reader" and t.is_alive() for t in threading.enumerate())
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def test_the_next_pass_is_read_ahead_and_trained_as_without(tmp_path: Path) -> None:
    first = write_rows(tmp_path / "a", 0, 1000)
    second = write_rows(tmp_path / "b", 1000, 600)
    results = []
    for hint in ([second], []):
        for w in _worker():
            w.run([first], next_files=hint)
            results.append((w.run([second]), w.outcomes()))
    (ahead, counted), (plain, none) = results
    assert counted == {"used": 1, "changed": 0, "dropped": 0}
    assert none == {"used": 0, "changed": 0, "dropped": 0}
    assert ahead.examples == plain.examples == 600 and ahead.files_read == 1
    assert (ahead.files_read_ahead, plain.files_read_ahead) == (1, 0)
    # The same data, trained alike: the same predictions, bucket for bucket.
    assert ahead.pos_buckets == plain.pos_buckets and ahead.neg_buckets == plain.neg_buckets
    assert ahead.loss_sum == plain.loss_sum


def test_a_file_rewritten_after_it_was_read_ahead_is_read_again(
    worker: Worker, tmp_path: Path
) -> None:
    first = write_rows(tmp_path / "a", 0, 1000)
    second = write_rows(tmp_path / "b", 1000, 600)
    worker.run([first], next_files=[second])
    write_rows(second, 2000, 300)  # rewritten in place between the read ahead and the RunPass
    result = worker.run([second])
    assert result.examples == 300  # its new content, not what was parsed ahead
    assert result.files_read_ahead == 0
    assert worker.outcomes() == {"used": 0, "changed": 1, "dropped": 0}
    assert readers_alive() == 0


def test_a_file_replaced_with_the_same_size_and_mtime_is_read_again(tmp_path: Path) -> None:
    """A rename over the file keeps its size and (set back) its mtime: the inode tells."""
    config = WorkerConfig.from_dict(CONFIG)
    path = write_rows(tmp_path / "b", 0, 200)
    seen: list[Outcome] = []
    ahead = ReadAhead(lambda files: PassReader(files, config.data, 128), on_outcome=seen.append)
    ahead.start([str(path)])
    before = path.stat()
    other = tmp_path / "b.new"
    other.write_bytes(path.read_bytes()[::-1])  # same size, other bytes
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)
    assert path.stat().st_size == before.st_size
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert ahead.take([str(path)]) is None
    assert seen == [Outcome.CHANGED]


def test_a_hint_not_followed_by_its_pass_is_dropped(worker: Worker, tmp_path: Path) -> None:
    first = write_rows(tmp_path / "a", 0, 1000)
    hinted = write_rows(tmp_path / "b", 1000, 600)
    other = write_rows(tmp_path / "c", 1600, 400)
    worker.run([first], next_files=[hinted])
    assert worker.run([other]).examples == 400  # another pass came: the hint is dropped
    assert worker.outcomes() == {"used": 0, "changed": 0, "dropped": 1}
    worker.run([first], next_files=[hinted])
    worker.stub.Reset(worker_pb2.ResetRequest(generation=2), timeout=60)  # a restore follows
    assert worker.outcomes() == {"used": 0, "changed": 0, "dropped": 2}
    assert readers_alive() == 0  # nothing is held for a pass that never comes


def test_a_hint_naming_a_missing_file_reads_nothing_ahead(tmp_path: Path) -> None:
    config = WorkerConfig.from_dict(CONFIG)
    seen: list[Outcome] = []
    ahead = ReadAhead(lambda files: PassReader(files, config.data, 128), on_outcome=seen.append)
    later = tmp_path / "later"
    ahead.start([str(later)])  # not written yet: nothing to read ahead
    write_rows(later, 0, 100)
    assert ahead.take([str(later)]) is None
    assert seen == []


def test_a_read_ahead_begun_in_the_background_is_waited_for_and_trains_its_file(
    tmp_path: Path,
) -> None:
    """``begin`` stamps and starts off the training thread; ``take`` joins it first."""
    config = WorkerConfig.from_dict(CONFIG)
    path = write_rows(tmp_path / "b", 0, 200)
    seen: list[Outcome] = []
    ahead = ReadAhead(lambda files: PassReader(files, config.data, 128), on_outcome=seen.append)
    ahead.begin([str(path)])
    reader = ahead.take([str(path)])
    assert reader is not None and seen == [Outcome.USED]
    with reader:
        assert sum(batch.size for batch in reader) == 200
    ahead.begin([str(path)])
    ahead.drop()  # waits for the thread, then closes what it started
    assert seen == [Outcome.USED, Outcome.DROPPED]
    assert readers_alive() == 0
