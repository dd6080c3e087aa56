"""A capped shard's scratch reserve holds the largest request it admits, times the requests
it serves at once, and the server serves no more than that at once."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import CAPPED_REQUEST_KEYS, PSConfig, TableConfig
from streamtrain_ps.errors import MemoryLimitError, RequestTooLargeError
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier import memory_limit as ml
from streamtrain_ps.tier.request_gate import RequestGate

from .conftest import TIER_DIM as D
from .conftest import TIER_TABLE as T
from .conftest import tier_config as config

MIB = 1 << 20


def test_the_largest_admitted_request_is_bounded_by_keys_and_by_message_size() -> None:
    table = TableConfig(name="t", embedxDim=8)  # push_dim 9
    per_key = ml.REQUEST_FIXED_BYTES_PER_KEY + 9 * ml.REQUEST_BYTES_PER_COLUMN
    wire = ml.PUSH_WIRE_FIXED_BYTES + 4 * 9
    by_keys = PSConfig(tables=(table,), maxKeysPerRequest=1000)
    assert ml.request_scratch_bytes(by_keys) == (1000 * per_key, 1000 * wire)
    by_bytes = replace(by_keys, maxKeysPerRequest=10**6, maxMessageBytes=100 * wire)
    assert ml.request_scratch_bytes(by_bytes) == (100 * per_key, 100 * wire)
    # a capped shard admits no more than RemotePS sends, whatever maxKeysPerRequest allows
    assert ml.capped_request_keys(PSConfig(tables=(table,))) == CAPPED_REQUEST_KEYS
    wide = PSConfig(tables=(table, TableConfig(name="w", embedxDim=64)), maxKeysPerRequest=10)
    assert ml.request_scratch_bytes(wide)[0] == 10 * (
        ml.REQUEST_FIXED_BYTES_PER_KEY + 65 * ml.REQUEST_BYTES_PER_COLUMN
    )


def test_the_reserve_is_the_requests_in_flight_and_the_rest_goes_to_tables() -> None:
    request = (30 * MIB, 4 * MIB)
    small = ml.MemoryBudget.measure(300 * MIB, 200 * MIB, request=request)
    assert small.requests_in_flight == 1  # a 30 % share (30 MiB) holds less than one
    # one request in flight, a message at the gate per spare RPC thread
    assert small.scratch == 30 * MIB + ml.SPARE_RPC_THREADS * 4 * MIB + ml.STORE_OUTSIDE_CACHE
    rest = 100 * MIB - small.store - small.scratch - ml.HUGE_PAGE_SLACK_PER_TABLE
    assert small.tables == rest
    assert small.rpc_threads == 1 + ml.SPARE_RPC_THREADS
    large = ml.MemoryBudget.measure(2048 * MIB, 200 * MIB, request=request)
    n = min(os.cpu_count() or 1, int(1848 * MIB * ml.SCRATCH_SHARE) // (34 * MIB))
    assert large.requests_in_flight == n
    waiting = n + ml.SPARE_RPC_THREADS - 1
    assert large.scratch == n * 30 * MIB + waiting * 4 * MIB + ml.STORE_OUTSIDE_CACHE


def test_a_limit_below_one_request_in_flight_is_refused_naming_max_keys() -> None:
    with pytest.raises(MemoryLimitError, match=r"maxKeysPerRequest .* raise it to at least"):
        ml.MemoryBudget.measure(260 * MIB, 200 * MIB, request=(50 * MIB, 4 * MIB))
    budget = ml.MemoryBudget.measure(400 * MIB, 200 * MIB, request=(50 * MIB, 4 * MIB))
    # the limit suggested for a table budget is computed with the same request reserve
    need = 2 * budget.tables
    suggested = budget.limit_for_tables(need)
    assert ml.MemoryBudget.measure(suggested, 200 * MIB, request=(50 * MIB, 4 * MIB)).tables >= need


def test_the_server_serves_no_more_sparse_requests_at_once_than_the_budget(
    tmp_path: Path,
) -> None:
    budget = ml.MemoryBudget(10**9, 0, 0, 0, 10**9, requests_in_flight=1, request_bytes=10**6)
    cfg = config(tmp_path / "disk", 10**9)
    shard = Shard(cfg, memory_budget=budget)
    try:
        _pull_waits_at_the_gate(shard, cfg)
        # no request larger than the reserve holds: RemotePS's request size at the most
        too_many = np.arange(1, CAPPED_REQUEST_KEYS + 2, dtype=np.uint64)
        with pytest.raises(RequestTooLargeError, match=f"the {CAPPED_REQUEST_KEYS} a shard under"):
            shard.pull_sparse(T, too_many)
    finally:
        shard.close()


def _pull_waits_at_the_gate(shard: Shard, cfg: PSConfig) -> None:
    server = PSServer(shard, cfg)
    server.start()
    keys = np.arange(1, 101, dtype=np.uint64)
    done = threading.Event()
    try:
        with RemotePS([server.address], cfg) as ps:
            ps.wait_ready()
            with shard.request_slot(10**9):  # the whole reserve taken: a pull waits
                t = threading.Thread(target=lambda: (ps.pull_sparse(T, keys), done.set()))
                t.start()
                assert not done.wait(0.5)
            assert done.wait(30)
            t.join()
            assert ps.pull_sparse(T, keys).shape == (100, 3 + D)
    finally:
        server.close()


def test_requests_are_admitted_while_their_bytes_fit_beside_those_in_flight() -> None:
    gate = RequestGate(capacity=100, bytes_per_key=10)
    order: list[str] = []
    with gate.admit(4), gate.admit(6):  # 40 + 60 bytes: both fit at once
        assert gate.used == 100
        waiter = threading.Thread(target=lambda: _admit(gate, 1, order))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and not order  # 10 more bytes do not fit
    waiter.join(30)
    assert order == ["in"] and gate.used == 0
    with gate.admit(10**6):  # larger than the whole gate: admitted alone
        assert gate.used == 100
    unbounded = RequestGate(capacity=0, bytes_per_key=10)
    with unbounded.admit(10**9), unbounded.admit(10**9):
        assert unbounded.used == 0


def _admit(gate: RequestGate, keys: int, order: list[str]) -> None:
    with gate.admit(keys):
        order.append("in")
