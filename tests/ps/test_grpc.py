"""RemotePS against real servers on 127.0.0.1: routing, dedup, merge, save/load across
server counts, health, graceful SIGTERM, retries and error mapping."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamtrain_ps import api, sharding
from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import (
    InvalidRequestError,
    PSError,
    PSUnavailableError,
    RequestTooLargeError,
    UnknownTableError,
)
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service import wire
from streamtrain_ps.service.server import SERVICE_NAME, PSServer
from streamtrain_ps.shard import Shard

from .conftest import Cluster, SpawnedPS, small_config

DIM = 4  # embedxDim of small_config's "embedding" table


def _push(
    ps: RemotePS | Shard, keys: npt.NDArray[np.uint64], show: float = 1.0, click: float = 0.0
) -> None:
    n = keys.size
    grads = np.tile(np.arange(1, DIM + 2, dtype=np.float32), (n, 1))
    ps.push_sparse(
        "embedding",
        SparsePush(keys, grads, np.full(n, show, np.float32), np.full(n, click, np.float32), None),
    )


def test_keys_are_routed_to_their_server(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(3)
    ps = cluster.client()
    keys = np.arange(1, 301, dtype=np.uint64) * np.uint64(7919)
    _push(ps, keys)
    owner = sharding.server_of_key(keys, cluster.config.logicalShards, 3)
    for i, shard in enumerate(cluster.shards):
        mine = keys[owner == i]
        assert mine.size > 0
        (table,) = [t for t in shard.stats().tables if t.name == "embedding"]
        assert table.keys == mine.size
        np.testing.assert_array_equal(shard.pull_sparse("embedding", mine)[:, 0], 1.0)
    remote = ps.pull_sparse("embedding", keys)
    assert remote.shape == (keys.size, 3 + DIM)
    for i, shard in enumerate(cluster.shards):
        np.testing.assert_array_equal(
            remote[owner == i], shard.pull_sparse("embedding", keys[owner == i])
        )
    assert ps.stats().tables[0].keys == keys.size


class SpyShard(Shard):
    """A real shard that records the key counts it was asked for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pulled: list[int] = []
        self.pushed: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]] = []

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        self.pulled.append(int(keys.size))
        return super().pull_sparse(table, keys)

    def push_sparse(self, table: str, push: SparsePush) -> int:
        self.pushed.append((np.array(push.keys), np.array(push.shows)))
        return super().push_sparse(table, push)


def test_pull_dedups_and_push_merges_client_side() -> None:
    cfg = small_config()
    shard = SpyShard(cfg)
    server = PSServer(shard, cfg)
    server.start()
    try:
        with RemotePS([server.address], cfg) as ps:
            keys = np.array([9, 3, 9, 9, 3, 11], dtype=np.uint64)
            shows = np.array([1, 2, 3, 4, 5, 6], dtype=np.float32)
            grads = np.ones((6, DIM + 1), np.float32)
            ps.push_sparse("embedding", SparsePush(keys, grads, shows, np.zeros(6, np.float32)))
            (sent_keys, sent_shows), *_ = shard.pushed
            assert sorted(sent_keys.tolist()) == [3, 9, 11]
            assert dict(zip(sent_keys.tolist(), sent_shows.tolist(), strict=True)) == {
                9: 8.0,
                3: 7.0,
                11: 6.0,
            }
            rows = ps.pull_sparse("embedding", keys)
            assert shard.pulled == [3]
            np.testing.assert_array_equal(rows[:, 0], [8, 7, 8, 8, 7, 6])
            np.testing.assert_array_equal(rows[0], rows[2])
            # unknown keys pull as zeros and are not created
            assert not ps.pull_sparse("embedding", np.array([12345], np.uint64)).any()
            assert ps.pull_sparse("embedding", np.array([], np.uint64)).shape == (0, 3 + DIM)
    finally:
        server.close(grace=0)


def test_big_requests_are_chunked_within_limits(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(2, small_config(maxKeysPerRequest=100, maxMessageBytes=4096))
    ps = cluster.client(request_keys=10_000)
    keys = np.arange(1, 2001, dtype=np.uint64)
    _push(ps, keys)
    rows = ps.pull_sparse("embedding", keys)
    np.testing.assert_array_equal(rows[:, 0], 1.0)
    assert ps.stats().tables[0].keys == 2000
    pulls = sum(
        s.registry.get_sample_value(
            "streamtrain_ps_rpc_duration_seconds_count", {"method": "PullSparse", "shard": str(i)}
        )
        or 0
        for i, s in enumerate(cluster.servers)
    )
    # 2000 keys at most 100 per request (and 4 KiB responses: 146 rows of 7 floats)
    assert pulls >= 20


def test_dense_vectors_route_by_name(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(2)
    ps = cluster.client()
    for name in ("dnn.w", "dnn.b", "tower"):
        init = np.arange(5, dtype=np.float32)
        np.testing.assert_array_equal(ps.init_dense(name, init), init)
        # first writer wins
        np.testing.assert_array_equal(ps.init_dense(name, init + 1), init)
        ps.push_dense(name, np.ones(5, np.float32))
        after = ps.pull_dense(name)
        assert after.shape == (5,)
        assert (after < init).all()
        owner = sharding.server_of_dense(name, 2)
        assert name in cluster.shards[owner].stats().dense_names
        assert name not in cluster.shards[1 - owner].stats().dense_names
    assert set(ps.stats().dense_names) == {"dnn.w", "dnn.b", "tower"}


def test_push_batch_applies_rows_and_vectors_as_separate_pushes_would(
    ps_cluster: Callable[..., Cluster],
) -> None:
    """One push_batch over 2 servers equals push_dense per vector then push_sparse on a
    LocalPS of 2 shards, also when a vector's server gets no rows (a dense-only request)."""
    cluster = ps_cluster(2)
    ps = cluster.client()
    local = LocalPS(cluster.config, num_shards=2)
    names = ("dnn.w", "dnn.b", "tower")
    keys = np.arange(1, 41, dtype=np.uint64) * np.uint64(7919)
    owner = sharding.server_of_key(keys, cluster.config.logicalShards, 2)
    lone = keys[owner == 0][:1]  # rows for server 0 only: server 1's vectors ride alone
    try:
        for batch in (keys, lone):
            n = batch.size
            grads = np.tile(np.arange(1, DIM + 2, dtype=np.float32), (n, 1))
            counts = np.ones(n, np.float32), np.zeros(n, np.float32)
            dense = [(name, np.full(5, i + 1.0, np.float32)) for i, name in enumerate(names)]
            for side in (ps, local):
                for name in names:
                    side.init_dense(name, np.arange(5, dtype=np.float32))
                side.push_batch("embedding", SparsePush(batch, grads, *counts, None), dense=dense)
        assert {sharding.server_of_dense(n, 2) for n in names} == {0, 1}
        for name in names:
            np.testing.assert_array_equal(ps.pull_dense(name), local.pull_dense(name))
        np.testing.assert_array_equal(
            ps.pull_sparse("embedding", keys), local.pull_sparse("embedding", keys)
        )
        # an unknown vector fails the request with nothing applied
        before = ps.pull_sparse("embedding", keys)
        ones = np.ones(keys.size, np.float32)
        push = SparsePush(keys, np.ones((keys.size, DIM + 1), np.float32), ones, ones * 0)
        with pytest.raises(UnknownTableError):
            ps.push_batch("embedding", push, dense=[("missing", np.ones(5, np.float32))])
        owner_of_missing = sharding.server_of_dense("missing", 2)
        after = ps.pull_sparse("embedding", keys)
        mine = owner == owner_of_missing
        np.testing.assert_array_equal(after[mine], before[mine])
    finally:
        local.close()


def test_summary_vectors_over_grpc_keep_their_rule_through_a_checkpoint(
    ps_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """The summary rule travels in InitDense, is checked on every init, and is saved with
    the vector, so a reloaded PS keeps summing instead of running Adam on statistics."""
    ps = ps_cluster(2).client()
    init = np.array([1e4, 0.0, 1e4], np.float32)
    np.testing.assert_array_equal(ps.init_dense("norm", init, summary_decay=0.5), init)
    ps.push_dense("norm", np.array([2.0, 4.0, 6.0], np.float32))
    np.testing.assert_allclose(ps.pull_dense("norm"), [5002.0, 4.0, 5006.0])
    with pytest.raises(InvalidRequestError) as mismatch:
        ps.init_dense("norm", init)  # same name, optimizer rule: refused, not adopted
    assert mismatch.value.field == "summary"
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(InvalidRequestError) as invalid:
            ps.init_dense("other", init, summary_decay=bad)
        assert invalid.value.field == "summary.decay"
    uri = (tmp_path / "ckpt").as_uri()
    ps.save(uri, api.SaveMode.CHECKPOINT)
    reloaded = ps_cluster(1).client()
    reloaded.load(uri)
    reloaded.push_dense("norm", np.ones(3, np.float32))
    np.testing.assert_allclose(reloaded.pull_dense("norm"), [2502.0, 3.0, 2504.0])
    # the float64 sums travel through the checkpoint, not just their float32 copy
    big = ps_cluster(1).client()
    big.init_dense("sums", np.array([2.0**25], np.float32), summary_decay=1.0)
    for _ in range(3):
        big.push_dense("sums", np.ones(1, np.float32))
    uri2 = (tmp_path / "ckpt2").as_uri()
    big.save(uri2, api.SaveMode.CHECKPOINT)
    restored = ps_cluster(1).client()
    restored.load(uri2)
    restored.push_dense("sums", np.ones(1, np.float32))
    assert restored.pull_dense("sums")[0] == 2.0**25 + 4


def test_save_publish_load_into_a_different_server_count(
    ps_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    two = ps_cluster(2)
    ps2 = two.client()
    keys = np.arange(1, 501, dtype=np.uint64) * np.uint64(104729)
    _push(ps2, keys, show=2.0, click=1.0)
    ps2.init_dense("w", np.linspace(0, 1, 7, dtype=np.float32))
    before = ps2.pull_sparse("embedding", keys)
    uri = (tmp_path / "ckpt").as_uri()
    result = ps2.save(uri, api.SaveMode.CHECKPOINT)
    assert result.keys_saved == keys.size
    assert result.files
    three = ps_cluster(3)
    ps3 = three.client()
    assert ps3.load(uri) == keys.size
    np.testing.assert_array_equal(ps3.pull_sparse("embedding", keys), before)
    np.testing.assert_array_equal(ps3.pull_dense("w"), ps2.pull_dense("w"))
    assert sum(s.stats().tables[0].keys for s in three.shards) == keys.size


def test_wait_ready_rejects_endpoints_out_of_shard_order(
    ps_cluster: Callable[..., Cluster],
) -> None:
    cluster = ps_cluster(2)
    with (
        RemotePS(cluster.endpoints[::-1], cluster.config) as ps,
        pytest.raises(PSError, match="serves shard 1 of 2, but is endpoint 0 of 2"),
    ):
        ps.wait_ready(timeout=10)
    with (
        RemotePS(cluster.endpoints[:1], cluster.config) as ps,
        pytest.raises(PSError, match="serves shard 0 of 2, but is endpoint 0 of 1"),
    ):
        ps.wait_ready(timeout=10)


def test_health_reports_serving(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(1)
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND


def test_graceful_stop_reports_not_serving_to_watchers() -> None:
    cfg = small_config()
    server = PSServer(Shard(cfg), cfg)
    server.start()
    channel = grpc.insecure_channel(server.address)
    try:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30
        )
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        stopped = server.stop(grace=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()  # the last in-flight RPC: the server stops before the grace ends
        assert stopped.wait(timeout=30)
    finally:
        channel.close()
        server.close(grace=0)


def test_errors_map_back_to_the_local_exception_classes(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(1, small_config(maxKeysPerRequest=10))
    ps = cluster.client()
    local = Shard(cluster.config)
    with pytest.raises(UnknownTableError) as unknown:
        ps.pull_dense("missing")
    with pytest.raises(UnknownTableError) as local_unknown:
        local.pull_dense("missing")
    assert (unknown.value.kind, unknown.value.name) == (local_unknown.value.kind, "missing")
    assert str(unknown.value) == str(local_unknown.value)
    with pytest.raises(UnknownTableError) as odd:  # names travel as binary metadata
        ps.pull_dense("wëird\nname ☃")
    assert odd.value.name == "wëird\nname ☃"
    ps.init_dense("w", np.zeros(3, np.float32))
    local.init_dense("w", np.zeros(3, np.float32))
    with pytest.raises(InvalidRequestError) as invalid:
        ps.push_dense("w", np.zeros(4, np.float32))
    with pytest.raises(InvalidRequestError) as local_invalid:
        local.push_dense("w", np.zeros(4, np.float32))
    assert invalid.value.field == local_invalid.value.field == "grads"
    assert str(invalid.value) == str(local_invalid.value)
    with pytest.raises(UnknownTableError):
        ps.pull_sparse("missing", np.arange(3, dtype=np.uint64))
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        with pytest.raises(grpc.RpcError) as raw:
            stub.PullSparse(
                ps_pb2.PullSparseRequest(table="embedding", keys=bytes(8 * 11)), timeout=5
            )
        assert raw.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    # the client splits to respect maxKeysPerRequest, so a big pull still works
    assert ps.pull_sparse("embedding", np.arange(25, dtype=np.uint64)).shape == (25, 3 + DIM)


def test_oversized_message_is_rejected_by_grpc(ps_cluster: Callable[..., Cluster]) -> None:
    cluster = ps_cluster(1, small_config(maxMessageBytes=4096))
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.PullSparse(
                ps_pb2.PullSparseRequest(table="embedding", keys=bytes(8 * 1024)), timeout=5
            )
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        ok = stub.PullSparse(ps_pb2.PullSparseRequest(table="embedding", keys=bytes(8)), timeout=5)
        assert ok.dim == 3 + DIM
    ps = cluster.client()
    with pytest.raises(RequestTooLargeError):
        ps.init_dense("big", np.zeros(2048, np.float32))


def test_unavailable_is_retried_until_the_server_comes_back() -> None:
    cfg = small_config()
    shard = Shard(cfg)
    first = PSServer(shard, cfg)
    port = first.start()
    first.close(grace=0)
    retried = threading.Event()
    policy = RetryPolicy(
        max_attempts=1000, initial_backoff=0.01, max_backoff=0.05, total_seconds=60
    )
    ps = RemotePS([f"127.0.0.1:{port}"], cfg, retry=policy, on_retry=lambda *_: retried.set())
    second = PSServer(shard, cfg, port=port)
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(ps.pull_sparse, "embedding", np.arange(4, dtype=np.uint64))
            assert retried.wait(timeout=30)
            second.start()
            assert pending.result(timeout=60).shape == (4, 3 + DIM)
    finally:
        ps.close()
        second.close(grace=0)


def test_unavailable_after_the_retry_budget_raises_ps_unavailable() -> None:
    cfg = small_config()
    server = PSServer(Shard(cfg), cfg)
    port = server.start()
    server.close(grace=0)
    attempts: list[int] = []
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02, total_seconds=10)
    with (
        RemotePS(
            [f"127.0.0.1:{port}"],
            cfg,
            retry=policy,
            on_retry=lambda _m, _e, n, _c: attempts.append(n),
        ) as ps,
        pytest.raises(PSUnavailableError, match="UNAVAILABLE after 3 attempts"),
    ):
        ps.pull_sparse("embedding", np.arange(4, dtype=np.uint64))
    assert attempts == [1, 2]


def test_subprocess_server_stops_gracefully_on_sigterm(spawn_ps: Callable[..., SpawnedPS]) -> None:
    cfg = small_config()
    spawned = spawn_ps(cfg, "--shard-index", "1", "--num-shards", "2")
    with grpc.insecure_channel(spawned.address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stats = stub.Stats(ps_pb2.StatsRequest(), timeout=20)
        assert (stats.shard_index, stats.num_shards) == (1, 2)
        keys = np.arange(1, 40, dtype=np.uint64)
        keys = keys[sharding.server_of_key(keys, cfg.logicalShards, 2) == 1]  # shard 1's keys
        n = keys.size
        enc = wire.encode_push(
            keys,
            np.zeros((n, DIM + 1), np.float32),
            np.ones(n, np.float32),
            np.zeros(n, np.float32),
        )
        pushed = stub.PushSparse(
            ps_pb2.PushSparseRequest(
                table="embedding",
                **enc,
            ),
            timeout=20,
        )
        assert pushed.keys_updated == n
    spawned.process.send_signal(signal.SIGTERM)
    assert spawned.process.wait(timeout=30) == 0
    assert any("stopped" in line for line in spawned.lines_until("stopped", timeout=10))


def test_remote_and_local_ps_agree(ps_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    """The same calls on LocalPS(2 shards) and RemotePS(2 servers): same values, same errors."""
    cluster = ps_cluster(2)
    remote = cluster.client()
    local = LocalPS(cluster.config, num_shards=2)
    assert isinstance(remote, api.PSLike)
    rng = np.random.default_rng(7)
    try:
        for _ in range(3):
            keys = rng.integers(1, 300, 400).astype(np.uint64)  # many repeats
            grads = rng.standard_normal((400, DIM + 1)).astype(np.float32)
            shows = rng.integers(0, 3, 400).astype(np.float32)
            clicks = np.minimum(shows, rng.integers(0, 2, 400)).astype(np.float32)
            slots = (keys % 7).astype(np.uint32)
            for ps in (local, remote):
                ps.push_sparse("embedding", SparsePush(keys, grads, shows, clicks, slots))
        probe = np.arange(0, 320, dtype=np.uint64)
        np.testing.assert_allclose(
            remote.pull_sparse("embedding", probe),
            local.pull_sparse("embedding", probe),
            rtol=1e-6,
            atol=1e-7,
        )
        for ps in (local, remote):
            ps.init_dense("w", np.arange(4, dtype=np.float32))
            ps.push_dense("w", np.ones(4, np.float32))
        np.testing.assert_array_equal(remote.pull_dense("w"), local.pull_dense("w"))
        assert remote.shrink() == local.shrink()
        assert remote.stats() == local.stats()
        bad_calls = [
            lambda ps: ps.pull_sparse("embedding", np.arange(3, dtype=np.int64)),
            lambda ps: ps.push_sparse(
                "embedding",
                SparsePush(
                    np.arange(2, dtype=np.uint64),
                    np.zeros((2, DIM + 1), np.float64),
                    np.ones(2, np.float32),
                    np.zeros(2, np.float32),
                ),
            ),
            lambda ps: ps.push_dense("w", np.ones(5, np.float32)),
            lambda ps: ps.pull_dense("nope"),
            lambda ps: ps.pull_sparse("nope", np.arange(3, dtype=np.uint64)),
        ]
        for bad in bad_calls:
            with pytest.raises(PSError) as from_local:
                bad(local)
            with pytest.raises(PSError) as from_remote:
                bad(remote)
            assert type(from_remote.value) is type(from_local.value)
            if isinstance(from_local.value, InvalidRequestError):
                assert from_remote.value.field == from_local.value.field  # type: ignore[attr-defined]
            else:
                assert str(from_remote.value) == str(from_local.value)
        local_ckpt, remote_ckpt = (tmp_path / "l").as_uri(), (tmp_path / "r").as_uri()
        saved_local = local.save(local_ckpt, api.SaveMode.CHECKPOINT)
        saved_remote = remote.save(remote_ckpt, api.SaveMode.CHECKPOINT, {"day": "20261121"})
        assert saved_remote.keys_saved == saved_local.keys_saved
        assert sorted(f.rows for f in saved_remote.files) == sorted(
            f.rows for f in saved_local.files
        )
        fresh = LocalPS(cluster.config, num_shards=3)
        assert fresh.load(remote_ckpt) == saved_remote.keys_saved
        np.testing.assert_array_equal(
            fresh.pull_sparse("embedding", probe), remote.pull_sparse("embedding", probe)
        )
        fresh.close()
    finally:
        local.close()
