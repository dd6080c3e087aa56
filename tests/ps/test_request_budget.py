"""Bounded requests (``streamtrain_ps.plumbing.request_budget``): a shard process hit by N
concurrent maximum-size pushes stays under a stated RSS bound, answering what does not fit
with RESOURCE_EXHAUSTED (overloaded) that ``RemotePS`` retries; random bytes are
INVALID_ARGUMENT, logged once per peer and interval."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.plumbing.request_budget import RequestBudget, ThrottledLog, is_overloaded
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service import wire
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard

from .conftest import SpawnedPS, small_config

MiB = 1 << 20
MESSAGE = 24 * MiB
CONCURRENT = 8
WORKERS = 8


def _vm(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _push(keys: int, seed: int) -> ps_pb2.PushSparseRequest:
    """A push of ``keys`` rows over 50,000 distinct keys (the table stays small)."""
    rng = np.random.default_rng(seed)
    k = rng.integers(1, 50_000, keys, dtype=np.uint64)
    dim = 5  # push_dim of small_config's "embedding": 1 + embedxDim 4
    return ps_pb2.PushSparseRequest(
        table="embedding",
        keys=wire.encode_keys(k),
        grads=np.zeros((keys, dim), np.float32).tobytes(),
        dim=dim,
        shows=np.ones(keys, np.float32).tobytes(),
        clicks=np.zeros(keys, np.float32).tobytes(),
    )


def _storm(address: str, request: ps_pb2.PushSparseRequest) -> list[grpc.StatusCode]:
    options = [("grpc.max_send_message_length", 2 * MESSAGE)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)

        def one(_: int) -> grpc.StatusCode:
            try:
                stub.PushSparse(request, timeout=120)
                return grpc.StatusCode.OK
            except grpc.RpcError as err:
                assert err.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED or is_overloaded(err)
                return err.code()

        with ThreadPoolExecutor(CONCURRENT) as pool:
            return list(pool.map(one, range(CONCURRENT)))


def test_concurrent_maximum_size_pushes_keep_the_shard_under_its_bound(
    spawn_ps: Callable[..., SpawnedPS],
) -> None:
    """Bound: the RSS before the storm, plus one raw message per RPC thread (grpc hands each
    thread the whole message before Python can refuse it) plus 4x the in-flight cap (the
    parsed copy, the decoded arrays and the kernel's scratch of what is admitted): here
    8 x 24 MiB + 4 x 50 MiB = 392 MiB. Measured: 280 MiB with the cap; 394 MiB without
    it (every push admitted), growing with every further concurrent request."""
    config = small_config(maxMessageBytes=MESSAGE + MiB, maxKeysPerRequest=10_000_000)
    ps = spawn_ps(config, "--workers", str(WORKERS))
    pid = ps.process.pid
    request = _push((MESSAGE - 64) // (8 + 5 * 4 + 8), seed=1)
    assert MESSAGE - MiB < request.ByteSize() <= MESSAGE
    with grpc.insecure_channel(
        ps.address, options=[("grpc.max_send_message_length", 2 * MESSAGE)]
    ) as ch:
        ps_pb2_grpc.ParameterServerStub(ch).PushSparse(request, timeout=120)  # compile, grow
    time.sleep(0.5)
    before = _vm(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    codes = _storm(ps.address, request)
    peak = _vm(pid, "VmHWM")
    grown = peak - before
    bound = WORKERS * MESSAGE + 4 * config.inflight_bytes
    assert grpc.StatusCode.OK in codes
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grown < bound, f"grew {grown / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB: {codes}"


def test_remote_ps_backs_off_and_retries_an_overloaded_shard() -> None:
    """One-request cap: two clients' large pushes at once both land, the loser retried."""
    config = small_config(maxInflightBytes=1)
    shard = Shard(config)
    server = PSServer(shard, config)
    server.start()
    retries: list[str] = []
    retry = RetryPolicy(
        max_attempts=100_000, initial_backoff=0.01, max_backoff=0.05, total_seconds=60
    )
    clients = [
        RemotePS([server.address], config, retry=retry, on_retry=lambda m, *_: retries.append(m))
        for _ in range(4)
    ]
    try:
        keys = np.arange(1, 200_001, dtype=np.uint64)
        grads = np.zeros((keys.size, 5), np.float32)
        ones = np.ones(keys.size, np.float32)

        def push(c: RemotePS) -> None:
            c.push_sparse("embedding", SparsePush(keys, grads, ones, ones))

        with ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                list(pool.map(push, clients))
        # Every push applied once: 12 pushes of one show each per key.
        assert shard.stats().tables[0].keys == keys.size
        shows = clients[0].pull_sparse("embedding", keys[:10])[:, 0]
        assert shows.tolist() == [12.0] * 10
        assert "PushSparse" in retries  # some were refused as overloaded and retried
    finally:
        for c in clients:
            c.close()
        server.close(grace=0)
        shard.close()


def test_random_bytes_are_invalid_argument_logged_once_per_peer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = small_config()
    shard = Shard(config)
    server = PSServer(shard, config)
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel, caplog.at_level(logging.WARNING):
            call = channel.unary_unary("/streamtrain.ps.v1.ParameterServer/PullSparse")
            for _ in range(20):
                with pytest.raises(grpc.RpcError) as err:
                    call(b"\xff" * 64 + os.urandom(64), timeout=10)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        lines = [r for r in caplog.records if "malformed" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        server.close(grace=0)
        shard.close()


def test_throttled_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttled = ThrottledLog(interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert throttled.warning("peer-a", "bad")
        assert not throttled.warning("peer-a", "bad")
        assert throttled.warning("peer-b", "bad")  # another peer: its own line
        now[0] = 61
        assert throttled.warning("peer-a", "bad")
    assert caplog.records[-1].getMessage() == "peer-a: bad (1 more since the last line)"
    assert RequestBudget(0).used == 0
