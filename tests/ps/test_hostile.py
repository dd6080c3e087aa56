"""Hostile input: hypothesis feeds random fields and random raw bytes to every RPC of a live
server. Every answer must be a proper status (never INTERNAL for a well-formed message, never
a crash), and the server must still answer a valid request afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service import wire
from streamtrain_ps.service.server import SERVICE_NAME, PSServer
from streamtrain_ps.shard import Shard

from .conftest import small_config

MAX_KEYS = 64
MAX_BYTES = 16 * 1024
EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
METHODS: dict[str, type[Any]] = {
    "PullSparse": ps_pb2.PullSparseRequest,
    "PushSparse": ps_pb2.PushSparseRequest,
    "InitDense": ps_pb2.InitDenseRequest,
    "PullDense": ps_pb2.PullDenseRequest,
    "PushDense": ps_pb2.PushDenseRequest,
    "Shrink": ps_pb2.ShrinkRequest,
    "Stats": ps_pb2.StatsRequest,
    "FinishSave": ps_pb2.FinishSaveRequest,
}


@dataclass
class Live:
    server: PSServer
    channel: grpc.Channel
    stub: ps_pb2_grpc.ParameterServerStub
    tmp: Path

    def status(self, method: str, request: Any) -> grpc.StatusCode:
        try:
            getattr(self.stub, method)(request, timeout=10)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    def raw_status(self, method: str, payload: bytes) -> grpc.StatusCode:
        call = self.channel.unary_unary(
            f"/{SERVICE_NAME}/{method}",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            call(payload, timeout=10)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    def assert_alive(self) -> None:
        health = health_pb2_grpc.HealthStub(self.channel)
        resp = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        keys = wire.encode_keys(np.array([1, 2], np.uint64))
        pulled = self.stub.PullSparse(
            ps_pb2.PullSparseRequest(table="embedding", keys=keys), timeout=10
        )
        assert pulled.dim == 7
        assert len(pulled.values) == 2 * 7 * 4


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    cfg = small_config(maxKeysPerRequest=MAX_KEYS, maxMessageBytes=MAX_BYTES)
    server = PSServer(Shard(cfg), cfg, max_workers=4)
    server.start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield Live(
            server,
            channel,
            ps_pb2_grpc.ParameterServerStub(channel),
            tmp_path_factory.mktemp("hostile"),
        )
    finally:
        channel.close()
        server.close(grace=0)


tables = st.one_of(st.sampled_from(["embedding", "other", "", "nope"]), st.text(max_size=20))
blobs = st.binary(max_size=700)


@SETTINGS
@given(table=tables, keys=blobs)
def test_random_pulls(live: Live, table: str, keys: bytes) -> None:
    code = live.status("PullSparse", ps_pb2.PullSparseRequest(table=table, keys=keys))
    assert code in EXPECTED
    if table == "embedding" and len(keys) % 8 == 0 and len(keys) // 8 <= MAX_KEYS:
        assert code is grpc.StatusCode.OK
    live.assert_alive()


@SETTINGS
@given(
    table=tables,
    keys=blobs,
    grads=st.binary(max_size=3000),
    dim=st.one_of(st.integers(0, 12), st.integers(0, 2**32 - 1)),
    shows=blobs,
    clicks=blobs,
    slots=blobs,
)
def test_random_pushes(
    live: Live,
    *,
    table: str,
    keys: bytes,
    grads: bytes,
    dim: int,
    shows: bytes,
    clicks: bytes,
    slots: bytes,
) -> None:
    request = ps_pb2.PushSparseRequest(
        table=table, keys=keys, grads=grads, dim=dim, shows=shows, clicks=clicks, slots=slots
    )
    code = live.status("PushSparse", request)
    assert code in EXPECTED
    live.assert_alive()


@SETTINGS
@given(n=st.integers(0, 3 * MAX_KEYS), dim=st.integers(0, 8), seed=st.integers(0, 2**16))
def test_well_formed_pushes_of_any_size_and_dim(live: Live, n: int, dim: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    enc = wire.encode_push(
        rng.integers(0, 2**63, n, dtype=np.uint64),
        rng.standard_normal((n, dim)).astype(np.float32),
        rng.integers(0, 3, n).astype(np.float32),
        np.zeros(n, np.float32),
        rng.integers(0, 100, n),
    )
    request = ps_pb2.PushSparseRequest(
        table="embedding",
        **enc,
    )
    code = live.status("PushSparse", request)
    if request.ByteSize() > MAX_BYTES or n > MAX_KEYS:
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    elif dim != 5:
        assert code is grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert code is grpc.StatusCode.OK
    live.assert_alive()


@SETTINGS
@given(
    name=st.text(max_size=12),
    values=blobs,
    which=st.sampled_from(["InitDense", "PushDense", "PullDense"]),
)
def test_random_dense(live: Live, name: str, values: bytes, which: str) -> None:
    request: Any
    if which == "InitDense":
        request = ps_pb2.InitDenseRequest(name=name, values=values)
    elif which == "PushDense":
        request = ps_pb2.PushDenseRequest(name=name, grads=values)
    else:
        request = ps_pb2.PullDenseRequest(name=name)
    assert live.status(which, request) in EXPECTED
    live.assert_alive()


@SETTINGS
@given(
    mode=st.integers(4, 2**32 - 1), table=tables, missing=st.text("abcdef", min_size=1, max_size=8)
)
def test_random_control_plane(live: Live, mode: int, table: str, missing: str) -> None:
    uri = (live.tmp / "never-written").as_uri()
    assert live.status("Save", ps_pb2.SaveRequest(uri=uri, mode=mode, table=table)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    load = live.status("Load", ps_pb2.LoadRequest(uri=(live.tmp / missing).as_uri()))
    assert load is grpc.StatusCode.FAILED_PRECONDITION
    assert live.status("Shrink", ps_pb2.ShrinkRequest(table=table)) in EXPECTED
    assert not (live.tmp / "never-written").exists()
    live.assert_alive()


@SETTINGS
@given(
    save_id=st.text(max_size=20),
    commit=st.booleans(),
    phase=st.integers(0, 2**31 - 1),
    load_id=st.text(max_size=12),
    client_id=st.binary(max_size=100),
    seq=st.integers(0, 2**64 - 1),
    acked=st.integers(0, 2**64 - 1),
)
def test_random_two_phase_calls_and_request_ids(
    live: Live,
    *,
    save_id: str,
    commit: bool,
    phase: int,
    load_id: str,
    client_id: bytes,
    seq: int,
    acked: int,
) -> None:
    """Finishing saves and loads that were never staged, unknown load phases and arbitrary
    push ids: an error status (or a no-op), never a crash, never a stuck server."""
    uri = (live.tmp / "never-staged").as_uri()
    finish = ps_pb2.FinishSaveRequest(uri=uri, save_id=save_id, commit=commit)
    code = live.status("FinishSave", finish)
    if not save_id:
        assert code is grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert code is (grpc.StatusCode.FAILED_PRECONDITION if commit else grpc.StatusCode.OK)
    load = ps_pb2.LoadRequest(uri=uri, load_id=load_id)
    load.phase = phase  # type: ignore[assignment]  # proto3 enums are open: any int
    assert live.status("Load", load) in EXPECTED
    keys = wire.encode_keys(np.array([3], np.uint64))
    push = ps_pb2.PushSparseRequest(
        table="embedding",
        keys=keys,
        grads=bytes(5 * 4),
        dim=5,
        shows=bytes(4),
        clicks=bytes(4),
        id=ps_pb2.RequestId(client_id=client_id, seq=seq, acked_below=acked),
    )
    code = live.status("PushSparse", push)
    if client_id and (len(client_id) > 64 or seq < 1):
        assert code is grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT)  # below acked
    live.assert_alive()


@SETTINGS
@given(method=st.sampled_from(sorted(METHODS)), payload=st.binary(max_size=2000))
def test_random_raw_bytes(live: Live, method: str, payload: bytes) -> None:
    """Bytes that do not even parse: grpc itself answers (INTERNAL, "deserializing")."""
    code = live.raw_status(method, payload)
    try:
        METHODS[method].FromString(payload)
    except DecodeError:
        assert code in EXPECTED | {grpc.StatusCode.INTERNAL}
    else:
        assert code in EXPECTED
    live.assert_alive()


@settings(SETTINGS, max_examples=5)
@given(extra=st.integers(1, 4 * MAX_BYTES))
def test_oversized_messages_are_rejected(live: Live, extra: int) -> None:
    keys = bytes(MAX_BYTES + extra - MAX_BYTES % 8)
    code = live.status("PullSparse", ps_pb2.PullSparseRequest(table="embedding", keys=keys))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    live.assert_alive()
