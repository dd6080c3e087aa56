"""A capped shard process that holds more than its memory split counts gives the difference
back: from the disk tier's cache first, then from the table budget, which the governor then
demotes to; the same excess seen again is not taken twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain_ps.config import SparseOptimizerConfig, TableConfig
from streamtrain_ps.tier import memory_limit as ml
from streamtrain_ps.tier.disk_store import MIN_STORE_MEMORY, StoreMemory
from streamtrain_ps.tier.memory_feedback import SplitCorrection
from streamtrain_ps.tier.tiering import DiskOptions, TieredTable

MIB = 1 << 20


def correction() -> SplitCorrection:
    return SplitCorrection(
        fixed=100 * MIB, store=16 * MIB, store_floor=4 * MIB, tables=60 * MIB, tables_floor=30 * MIB
    )


def test_memory_within_the_split_cuts_nothing() -> None:
    c = correction()
    # fixed + cache used + tables resident + requests in flight: exactly what it counts
    assert c.observe(100 * MIB + 10 * MIB + 50 * MIB + 7 * MIB, 7 * MIB, 10 * MIB, 50 * MIB) == 0
    assert (c.store_capacity, c.table_budget) == (16 * MIB, 60 * MIB)


def test_an_excess_comes_off_the_cache_first_then_the_tables_down_to_their_floors() -> None:
    c = correction()
    assert c.observe(100 * MIB + 10 * MIB + 50 * MIB + 5 * MIB, 0, 10 * MIB, 50 * MIB) == 5 * MIB
    assert (c.store_capacity, c.table_budget) == (11 * MIB, 60 * MIB)
    # 20 MiB beyond: 12 MiB is all the cache gives above its floor, 8 MiB from the tables
    assert c.observe(100 * MIB + 10 * MIB + 50 * MIB + 20 * MIB, 0, 10 * MIB, 50 * MIB) == 15 * MIB
    assert (c.store_capacity, c.table_budget) == (4 * MIB, 52 * MIB)
    # far beyond: the tables keep their floor
    c.observe(10_000 * MIB, 0, 0, 0)
    assert (c.store_capacity, c.table_budget) == (4 * MIB, 30 * MIB)


def test_the_same_excess_seen_again_is_not_taken_twice() -> None:
    """A cut table budget does not lower the RSS of rows already resident, so the next trim
    sees the same excess; the cut is the most ever seen, not a sum."""
    c = correction()
    seen = (100 * MIB + 10 * MIB + 50 * MIB + 20 * MIB, 0, 10 * MIB, 50 * MIB)
    assert c.observe(*seen) == 20 * MIB
    assert c.observe(*seen) == 0
    # requests in flight explain part of a higher RSS: nothing more to cut
    assert c.observe(seen[0] + 6 * MIB, 6 * MIB, *seen[2:]) == 0
    assert c.table_budget == 52 * MIB


def _table(path: Path, store: StoreMemory, n: int) -> TieredTable:
    tc = TableConfig(
        name="t", embedxDim=8, embedxThreshold=10.0, optimizer=SparseOptimizerConfig(type="adagrad")
    )
    table = TieredTable(tc, seed=0, disk=DiskOptions(path, 0, 16, store))
    keys = np.arange(1, n + 1, dtype=np.uint64)
    ones = np.ones(n, np.float32)
    grads = np.zeros((n, 9), np.float32)
    no_slots = np.empty(0, np.uint32)
    table.push_merged(table.merge(keys, grads, ones, ones * 0, no_slots, (16, 1, 0)), False)
    return table


def test_the_governor_gives_an_excess_back_and_demotes_to_the_cut_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StoreMemory(16 * MIB)
    table = _table(tmp_path / "disk", store, 300_000)
    try:
        ram = table.ram_bytes()
        budget = ml.MemoryBudget(
            limit=1000 * MIB,
            fixed_overhead=100 * MIB,
            store=16 * MIB,
            scratch=100 * MIB,
            tables=ram + MIB,
        )
        in_flight = [0]
        governor = ml.MemoryGovernor(budget, [table], store=store, in_flight=lambda: in_flight[0])
        fixed = 100 * MIB + ml.HUGE_PAGE_SLACK_PER_TABLE
        beyond = [0]

        def rss() -> int:
            return fixed + store.usage() + table.memory_bytes() + in_flight[0] + beyond[0]

        monkeypatch.setattr(ml, "current_rss_bytes", rss)
        monkeypatch.setattr(ml, "release_scratch_memory", lambda: None)
        in_flight[0] = 30 * MIB  # requests' bytes are theirs, not an excess
        assert governor.observe_after_trim() == 0
        in_flight[0] = 0
        beyond[0] = 14 * MIB  # 12 MiB from the cache (down to its floor), 2 from the tables
        assert governor.observe_after_trim() == 14 * MIB
        assert store.capacity_bytes == MIN_STORE_MEMORY
        assert governor.table_budget == budget.tables - (14 * MIB - (16 * MIB - MIN_STORE_MEMORY))
        assert governor.observe_after_trim() == 0  # the same excess again
        assert governor.enforce() > 0  # past the cut budget: the coldest keys go to disk
        assert table.ram_bytes() <= governor.table_budget
        assert table.disk_keys > 0
    finally:
        table.close()
