"""Hostile input for the worker control service: hypothesis sends random and malformed
RunPass / ExportDense / Reset requests (and raw bytes) to a live worker server backed by a real
PS server. Every answer must be a proper status naming the cause — never INTERNAL for a
message that parses — and the worker must still answer health and a valid RunPass afterwards.

The worker runs as root in CI containers, and ExportDense writes wherever its URI points, so
generated URIs are relative (the test chdirs into a temporary directory), point into that
directory, use an unknown protocol, or are empty; never an absolute path elsewhere.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.service import (
    MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    WorkerServer,
    WorkerServicer,
)
from streamtrain_worker.proto import worker_pb2, worker_pb2_grpc

CRITEO = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"
CONFIG = {
    "data": {"format": "criteo", "maxBadLineFraction": 0.01},
    "model": {"hiddenUnits": [8], "batchSize": 64, "denseSyncSteps": 2},
    "metrics": {"numBuckets": 256},
    "ps": {"config": {"logicalShards": 8}, "maxRetrySeconds": 1.0, "timeoutSeconds": 5.0},
}
#: Client errors the worker may answer with; INTERNAL or UNKNOWN would be a bug.
EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
#: The highest generation: a valid request with it is never fenced as stale.
TOP = 2**64 - 1
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
METHODS: dict[str, type[Any]] = {
    "RunPass": worker_pb2.RunPassRequest,
    "ExportDense": worker_pb2.ExportDenseRequest,
    "Reset": worker_pb2.ResetRequest,
}


@dataclass
class Live:
    server: WorkerServer
    channel: grpc.Channel
    stub: worker_pb2_grpc.WorkerStub
    files: dict[str, str]
    good: str

    def call(self, method: str, request: Any) -> grpc.StatusCode:
        try:
            getattr(self.stub, method)(request, timeout=60)
        except grpc.RpcError as err:
            assert err.details(), f"{method}: error status without a message"
            return err.code()
        return grpc.StatusCode.OK

    def raw(self, method: str, payload: bytes) -> grpc.StatusCode:
        call = self.channel.unary_unary(
            f"/{SERVICE_NAME}/{method}",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            call(payload, timeout=60)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    def assert_alive(self) -> None:
        health = health_pb2_grpc.HealthStub(self.channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def assert_trains(self) -> None:
        request = worker_pb2.RunPassRequest(
            day="20261101", pass_index=1, files=[self.good], generation=TOP, train=True
        )
        result = self.stub.RunPass(request, timeout=60)
        assert result.examples == 200 and result.bad_lines == 0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("hostile-worker")
    lines = CRITEO.read_text().splitlines(keepends=True)
    assert len(lines) == 7200, f"{CRITEO}: expected the 7,200-row sample"
    good = root / "part-good"
    good.write_text("".join(lines[:200]))
    garbage = root / "part-garbage"
    garbage.write_bytes(bytes(range(256)) * 64)
    truncated = root / "part-truncated.gz"
    truncated.write_bytes(gzip.compress("".join(lines[:300]).encode())[:700])
    empty = root / "part-empty"
    empty.write_bytes(b"")
    wrong_columns = root / "part-columns"
    wrong_columns.write_text("1\t2\n" * 50)
    files = {
        "garbage": str(garbage),
        "truncated": str(truncated),
        "empty": str(empty),
        "columns": str(wrong_columns),
        "directory": str(root),
        "missing": str(root / "missing"),
        "good": str(good),
    }
    config = WorkerConfig.from_dict(CONFIG)
    ps_server = PSServer(Shard(config.ps.config), config.ps.config)
    ps_server.start()
    retry = RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.1, total_seconds=2.0)
    ps = RemotePS([ps_server.address], config.ps.config, retry=retry)
    server = WorkerServer(WorkerServicer(config, ps))
    server.start()
    channel = grpc.insecure_channel(
        server.address, options=[("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)]
    )
    try:
        yield Live(server, channel, worker_pb2_grpc.WorkerStub(channel), files, str(good))
    finally:
        channel.close()
        server.close(grace=0)
        ps.close()
        ps_server.close(grace=0)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative export URIs land in a temporary directory, not the repository."""
    monkeypatch.chdir(tmp_path)


paths = st.one_of(
    st.sampled_from(["garbage", "truncated", "empty", "columns", "directory", "missing", "good"]),
    st.text(st.characters(exclude_characters="/\x00", exclude_categories=("Cs",)), max_size=30),
)


@SETTINGS
@given(
    day=st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
    pass_index=st.integers(0, 2**32 - 1),
    names=st.lists(paths, max_size=6),
    generation=st.integers(0, 2**64 - 1),
    train=st.booleans(),
)
def test_random_run_pass(
    live: Live, *, day: str, pass_index: int, names: list[str], generation: int, train: bool
) -> None:
    files = [live.files.get(n, n) for n in names]  # named fixtures, else a relative junk path
    request = worker_pb2.RunPassRequest(
        day=day, pass_index=pass_index, files=files, generation=generation, train=train
    )
    code = live.call("RunPass", request)
    assert code in EXPECTED
    if any(n in ("garbage", "columns", "missing", "directory", "truncated") for n in names):
        assert code is not grpc.StatusCode.OK
    live.assert_alive()


@settings(SETTINGS, max_examples=3)
@given(count=st.integers(10_000, 200_000))
def test_huge_file_lists_are_refused_or_fail_fast(live: Live, count: int) -> None:
    files = [live.files["missing"]] * count
    request = worker_pb2.RunPassRequest(day="20261101", pass_index=1, files=files, generation=TOP)
    assert live.call("RunPass", request) in {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    live.assert_alive()
    live.assert_trains()


uris = st.one_of(
    st.just(""),
    st.just("/"),
    st.builds(
        lambda scheme, rest: scheme + rest,
        st.sampled_from(["", "nope://", "file://", "memory://hostile/", "zip::"]),
        st.text(
            st.characters(exclude_characters="/\x00:", exclude_categories=("Cs",)), max_size=20
        ),
    ),
)


@SETTINGS
@given(uri=uris)
def test_random_export_uris(live: Live, uri: str) -> None:
    code = live.call("ExportDense", worker_pb2.ExportDenseRequest(uri=uri))
    assert code in EXPECTED
    if not uri.strip("/"):  # never the filesystem root: refused by the URI check or export
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    live.assert_alive()


@SETTINGS
@given(method=st.sampled_from(sorted(METHODS)), payload=st.binary(max_size=600))
def test_random_raw_bytes(live: Live, method: str, payload: bytes) -> None:
    """Bytes that do not parse get grpc's own INTERNAL ("deserializing"); bytes that parse
    are a request like any other."""
    try:
        parsed = METHODS[method].FromString(payload)
    except DecodeError:
        parsed = None
    if isinstance(parsed, worker_pb2.ExportDenseRequest):
        assume(not parsed.uri.startswith("/") and "://" not in parsed.uri)
    if isinstance(parsed, worker_pb2.RunPassRequest):
        assume(not any(f.startswith("/") for f in parsed.files))
    code = live.raw(method, payload)
    assert code in (EXPECTED if parsed is not None else EXPECTED | {grpc.StatusCode.INTERNAL})
    live.assert_alive()


def test_oversized_request_is_rejected_before_it_reaches_the_servicer(live: Live) -> None:
    files = ["x" * 1024] * (MAX_MESSAGE_BYTES // 1024 + 16)
    request = worker_pb2.RunPassRequest(day="20261101", pass_index=1, files=files, generation=TOP)
    assert live.call("RunPass", request) is grpc.StatusCode.RESOURCE_EXHAUSTED
    live.assert_alive()
    live.assert_trains()


def test_still_serves_after_the_onslaught(live: Live) -> None:
    live.assert_alive()
    live.assert_trains()
    assert live.call("Reset", worker_pb2.ResetRequest()) is grpc.StatusCode.OK
