"""A memory limit too small for one request's working set is refused as data: the PS
raises ``MemoryLimitError`` carrying the measured ``WorkingSet`` (keys, bytes, budget, the
limit that would hold it, the disk tier's state), sends it as ``RESOURCE_EXHAUSTED`` with a
``streamtrain-reason`` and the numbers in trailing metadata, and ``RemotePS`` rebuilds the
same exception from them."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import MEMORY_LIMIT_REASON, REASON_KEY, MemoryLimitError, WorkingSet
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service import wire
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import MemoryBudget

from .conftest import TIER_DIM as D
from .conftest import TIER_TABLE as T
from .conftest import capped_shard
from .conftest import tier_config as config
from .conftest import tier_step as step

MIB = 1 << 20


def push_new(shard: Shard | RemotePS, n: int, start: int = 1) -> None:
    keys = np.arange(start, start + n, dtype=np.uint64)
    ones = np.ones(n, np.float32)
    shard.push_sparse(T, SparsePush(keys, np.zeros((n, D + 1), np.float32), ones, ones * 0))


def refusal(shard: Shard | RemotePS, n: int, start: int = 1) -> WorkingSet:
    with pytest.raises(MemoryLimitError, match=r"spec\.ps\.memoryLimit .* at least \d+") as info:
        push_new(shard, n, start)
    assert info.value.working_set is not None
    return info.value.working_set


def test_a_refused_request_carries_its_measured_working_set(tmp_path: Path) -> None:
    shard = capped_shard(tmp_path, 20_000)
    ws = refusal(shard, 2_000)
    assert (ws.keys, ws.table_budget, ws.memory_limit) == (2_000, 20_000, 20_000)
    assert ws.needed_bytes > ws.table_budget // 2
    assert ws.needed_bytes >= 2_000 * 8  # at least a key each
    assert not ws.disk_full and ws.disk_limit == 0
    assert len(shard.table(T)) == 0, "the refused request changed nothing"
    shard.close()
    # the limit it suggests holds that request
    roomy = capped_shard(tmp_path / "roomy", ws.suggested_memory_limit)
    push_new(roomy, 2_000)
    assert len(roomy.table(T)) == 2_000
    roomy.close()


def test_a_full_disk_tier_is_reported_beside_the_memory_limit(tmp_path: Path) -> None:
    shard = capped_shard(tmp_path, 100_000, disk=60_000)
    rng = np.random.default_rng(5)
    for _ in range(60):
        step([shard], rng)
    assert shard.stats().tables[0].pressure_evictions_total > 0
    ws = refusal(shard, 20_000, start=10**9)
    assert ws.disk_full and ws.disk_limit == 60_000 and 0 < ws.disk_bytes <= 60_000
    shard.close()


def test_the_suggested_limit_is_the_smallest_split_that_holds_the_tables() -> None:
    fixed = 200 * MIB
    budget = MemoryBudget.measure(400 * MIB, fixed_overhead=fixed, num_tables=2)
    need = 3 * budget.tables
    suggested = budget.limit_for_tables(need, num_tables=2)
    assert suggested % MIB == 0
    assert MemoryBudget.measure(suggested, fixed, num_tables=2).tables >= need
    assert MemoryBudget.measure(suggested - MIB, fixed, num_tables=2).tables < need
    assert budget.limit_for_tables(budget.tables, num_tables=2) <= 400 * MIB


def test_over_grpc_it_is_resource_exhausted_with_the_numbers(tmp_path: Path) -> None:
    cfg = config(tmp_path / "disk", 20_000)
    shard = Shard(cfg, memory_budget=MemoryBudget.tables_only(20_000))
    local = refusal(capped_shard(tmp_path / "local", 20_000), 2_000)
    server = PSServer(shard, cfg)
    server.start()
    ps = RemotePS([server.address], cfg, retry=RetryPolicy(max_attempts=1))
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            n = 2_000
            with pytest.raises(grpc.RpcError) as raw:
                stub.PushSparse(
                    ps_pb2.PushSparseRequest(
                        table=T,
                        keys=wire.encode_keys(np.arange(1, n + 1, dtype=np.uint64)),
                        grads=np.zeros((n, D + 1), np.float32).tobytes(),
                        dim=D + 1,
                        shows=np.ones(n, np.float32).tobytes(),
                        clicks=np.zeros(n, np.float32).tobytes(),
                    ),
                    timeout=10,
                )
        assert raw.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        meta = raw.value.trailing_metadata()
        assert (REASON_KEY, MEMORY_LIMIT_REASON) in list(meta)
        assert WorkingSet.from_metadata(meta) == local
        assert refusal(ps, 2_000) == local  # RemotePS raises what a local shard raises
    finally:
        ps.close()
        server.close(grace=0)
        shard.close()


def test_metadata_without_every_number_is_no_working_set() -> None:
    ws = WorkingSet(10, 1000, 1500, 2000, 4 * MIB, 5000, 6000, True)
    meta = ws.metadata()
    assert WorkingSet.from_metadata(meta) == ws
    assert WorkingSet.from_metadata(meta[:-1]) is None
    assert WorkingSet.from_metadata([(k, v.encode()) for k, v in meta]) == ws
    assert WorkingSet.from_metadata([(REASON_KEY, "busy"), *meta[1:]]) is None
