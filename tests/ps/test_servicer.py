"""The servicer without a network: methods called directly with a fake context.

Checks the one error -> status mapping (code, details naming the field, trailing metadata),
that unexpected exceptions become INTERNAL with a logged traceback, and the happy paths.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.remote import save_result
from streamtrain_ps.proto import ps_pb2
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.service import wire
from streamtrain_ps.service.metrics import PSMetrics
from streamtrain_ps.service.servicer import FIELD_KEY, KIND_KEY, NAME_KEY, PSServicer
from streamtrain_ps.shard import Shard

from .conftest import small_config


class AbortError(Exception):
    """What grpc's ``context.abort`` raises."""


class FakeContext:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: dict[str, str] = {}

    def set_trailing_metadata(self, metadata: tuple[tuple[str, bytes], ...]) -> None:
        assert all(key.endswith("-bin") for key, _ in metadata)
        self.trailing.update({key: value.decode() for key, value in metadata})

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise AbortError(details)

    def peer(self) -> str:  # the control RPCs' audit line names the caller
        return "ipv4:127.0.0.1:1"

    def auth_context(self) -> dict[str, list[bytes]]:  # plaintext: no certificate
        return {}


def make(shard: Any = None) -> tuple[PSServicer, CollectorRegistry]:
    cfg = small_config(maxKeysPerRequest=100)
    registry = CollectorRegistry()
    return PSServicer(shard or Shard(cfg), cfg, PSMetrics(registry, 0)), registry


def call(method: Any, request: Any) -> FakeContext:
    ctx = FakeContext()
    with pytest.raises(AbortError):
        method(request, ctx)
    return ctx


def push_request(n: int = 3, dim: int = 5, **overrides: Any) -> ps_pb2.PushSparseRequest:
    enc = wire.encode_push(
        np.arange(1, n + 1, dtype=np.uint64),
        np.ones((n, dim), np.float32),
        np.ones(n, np.float32),
        np.zeros(n, np.float32),
        np.arange(n),
    )
    fields: dict[str, Any] = {"table": "embedding", **enc}
    fields.update(overrides)
    return ps_pb2.PushSparseRequest(**fields)


def test_push_then_pull_round_trip() -> None:
    servicer, registry = make()
    resp = servicer.PushSparse(push_request(), FakeContext())
    assert resp.keys_updated == 3
    keys = wire.encode_keys(np.array([1, 2, 3, 99], np.uint64))
    pulled = servicer.PullSparse(
        ps_pb2.PullSparseRequest(table="embedding", keys=keys), FakeContext()
    )
    rows = wire.decode_matrix(pulled.values, pulled.dim, "values", n=4, expected_dim=7)
    np.testing.assert_array_equal(rows[:3, 0], 1.0)
    assert not rows[3].any()
    count = registry.get_sample_value(
        "streamtrain_ps_rpc_duration_seconds_count", {"method": "PullSparse", "shard": "0"}
    )
    assert count == 1


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"dim": 4}, "dim"),
        ({"dim": 0}, "dim"),
        ({"keys": b"\0" * 7}, "keys"),
        ({"grads": b"\0" * 8}, "grads"),
        ({"shows": b""}, "shows"),
        ({"clicks": b"\0" * 13}, "clicks"),
        ({"slots": b"\0" * 4}, "slots"),
        ({"table": ""}, "table"),
        ({"grads": np.full((3, 5), np.nan, np.float32).tobytes()}, "grads"),
        ({"shows": np.full(3, -1, np.float32).tobytes()}, "shows"),
        ({"dense": [ps_pb2.DenseGrads(name="d", grads=b"\0" * 5)]}, "dense.grads"),
        ({"dense": [ps_pb2.DenseGrads(name="", grads=b"")]}, "name"),
    ],
)
def test_bad_push_is_invalid_argument_naming_the_field(
    request_fields: dict[str, Any], field: str
) -> None:
    servicer, registry = make()
    ctx = call(servicer.PushSparse, push_request(**request_fields))
    assert ctx.code is grpc.StatusCode.INVALID_ARGUMENT
    assert ctx.trailing[FIELD_KEY] == field
    assert ctx.details.startswith(f"{field}: ")
    errors = registry.get_sample_value(
        "streamtrain_ps_rpc_errors_total",
        {"method": "PushSparse", "code": "INVALID_ARGUMENT", "shard": "0"},
    )
    assert errors == 1


def test_unknown_table_and_dense_are_not_found() -> None:
    servicer, _ = make()
    ctx = call(servicer.PullSparse, ps_pb2.PullSparseRequest(table="nope", keys=b""))
    assert ctx.code is grpc.StatusCode.NOT_FOUND
    assert (ctx.trailing[KIND_KEY], ctx.trailing[NAME_KEY]) == ("table", "nope")
    ctx = call(servicer.PullDense, ps_pb2.PullDenseRequest(name="nope"))
    assert ctx.code is grpc.StatusCode.NOT_FOUND
    assert ctx.trailing[NAME_KEY] == "nope"
    ctx = call(servicer.Shrink, ps_pb2.ShrinkRequest(table="nope"))
    assert ctx.code is grpc.StatusCode.NOT_FOUND


def test_too_many_keys_is_resource_exhausted() -> None:
    servicer, _ = make()
    keys = wire.encode_keys(np.arange(101, dtype=np.uint64))
    ctx = call(servicer.PullSparse, ps_pb2.PullSparseRequest(table="embedding", keys=keys))
    assert ctx.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "maxKeysPerRequest 100" in ctx.details


def test_dense_requests_are_validated() -> None:
    servicer, _ = make()
    assert (
        call(servicer.InitDense, ps_pb2.InitDenseRequest(name="", values=b"")).trailing[FIELD_KEY]
        == "name"
    )
    ctx = call(servicer.InitDense, ps_pb2.InitDenseRequest(name="w", values=b""))
    assert ctx.trailing[FIELD_KEY] == "values"
    ctx = call(servicer.InitDense, ps_pb2.InitDenseRequest(name="w", values=b"\0" * 5))
    assert ctx.trailing[FIELD_KEY] == "values"
    init = servicer.InitDense(
        ps_pb2.InitDenseRequest(name="w", values=wire.encode_floats([1, 2])), FakeContext()
    )
    assert (init.name, init.version) == ("w", 0)
    ctx = call(servicer.PushDense, ps_pb2.PushDenseRequest(name="w", grads=wire.encode_floats([1])))
    assert (ctx.code, ctx.trailing[FIELD_KEY]) == (grpc.StatusCode.INVALID_ARGUMENT, "grads")
    pushed = servicer.PushDense(
        ps_pb2.PushDenseRequest(name="w", grads=wire.encode_floats([1, 1])), FakeContext()
    )
    assert pushed.version == 1
    pulled = servicer.PullDense(ps_pb2.PullDenseRequest(name="w"), FakeContext())
    assert pulled.version == 1
    assert (wire.decode_floats(pulled.values, "values") < [1, 2]).all()


def test_save_and_load_validation_and_failed_precondition(tmp_path: Path) -> None:
    servicer, registry = make()
    uri = (tmp_path / "ckpt").as_uri()
    ctx = call(servicer.Save, ps_pb2.SaveRequest(uri=uri, mode=7))
    assert (ctx.code, ctx.trailing[FIELD_KEY]) == (grpc.StatusCode.INVALID_ARGUMENT, "mode")
    ctx = call(servicer.Save, ps_pb2.SaveRequest(uri="", mode=0))
    assert ctx.trailing[FIELD_KEY] == "uri"
    ctx = call(servicer.Load, ps_pb2.LoadRequest(uri=(tmp_path / "missing").as_uri()))
    assert ctx.code is grpc.StatusCode.FAILED_PRECONDITION
    servicer.PushSparse(push_request(), FakeContext())
    saved = servicer.Save(ps_pb2.SaveRequest(uri=uri, mode=0), FakeContext())
    assert saved.keys_saved == 3
    assert all(f.sha256 and f.path for f in saved.files)
    assert (
        registry.get_sample_value(
            "streamtrain_ps_save_duration_seconds_count", {"mode": "checkpoint", "shard": "0"}
        )
        == 1
    )
    ctx = call(servicer.Load, ps_pb2.LoadRequest(uri=uri))  # parts written, not yet published
    assert ctx.code is grpc.StatusCode.FAILED_PRECONDITION
    checkpoint.publish(uri, [save_result(uri, SaveMode.CHECKPOINT, saved)], config=small_config())
    assert servicer.Load(ps_pb2.LoadRequest(uri=uri), FakeContext()).keys_loaded == 3
    assert (
        registry.get_sample_value("streamtrain_ps_load_duration_seconds_count", {"shard": "0"}) == 1
    )


class ExplodingShard(Shard):
    def stats(self) -> Any:
        raise RuntimeError("disk on fire")


def test_unexpected_exception_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    servicer, registry = make(ExplodingShard(small_config()))
    with caplog.at_level(logging.ERROR, logger="streamtrain_ps.service.servicer"):
        ctx = call(servicer.Stats, ps_pb2.StatsRequest())
    assert ctx.code is grpc.StatusCode.INTERNAL
    assert "RuntimeError: disk on fire" in ctx.details
    assert any(r.exc_info and "Stats failed unexpectedly" in r.getMessage() for r in caplog.records)
    assert (
        registry.get_sample_value(
            "streamtrain_ps_rpc_errors_total", {"method": "Stats", "code": "INTERNAL", "shard": "0"}
        )
        == 1
    )


def test_stats_reports_tables_and_dense() -> None:
    servicer, _ = make()
    servicer.PushSparse(push_request(), FakeContext())
    servicer.InitDense(
        ps_pb2.InitDenseRequest(name="w", values=wire.encode_floats([0.0])), FakeContext()
    )
    stats = servicer.Stats(ps_pb2.StatsRequest(), FakeContext())
    tables = {t.name: t for t in stats.tables}
    assert tables["embedding"].keys == 3
    assert tables["embedding"].expanded_keys == 3  # embedxThreshold 0
    assert tables["embedding"].memory_bytes > 0
    assert tables["other"].keys == 0
    assert list(stats.dense_names) == ["w"]
    assert (stats.shard_index, stats.num_shards) == (0, 1)
