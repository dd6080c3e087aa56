"""How much a demotion moves and which keys: a clock sweep takes cold keys and leaves the
hot ones, and one demotion moves at most ``DEMOTE_STEP_KEYS`` keys beyond a request's need,
however far past its budget the table is (it holds the writer lock while it writes every key
to RocksDB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamtrain_ps.api import SparsePush
from streamtrain_ps.tier import memory_limit as ml
from streamtrain_ps.tier.memory_limit import MemoryBudget, MemoryGovernor

from .conftest import TIER_DIM as D
from .conftest import TIER_TABLE as T
from .conftest import capped_shard


def test_a_sweep_takes_cold_keys_and_leaves_hot_ones(tmp_path: Path) -> None:
    shard = capped_shard(tmp_path, 10 << 20)
    t = shard.table(T)
    keys = np.arange(1, 40_001, dtype=np.uint64)
    hot = keys[::10]  # 4,000 keys seen 50 times, the rest once
    shows = np.where(keys % 10 == 1, 50.0, 1.0).astype(np.float32)
    grads = np.zeros((keys.size, D + 1), np.float32)
    shard.push_sparse(T, SparsePush(keys, grads, shows, np.zeros_like(shows)))
    assert t.disk_keys == 0
    for _ in range(5):  # five sweeps, more than a lap of the hand
        moved = t.demote(t.ram_bytes() - int(4_000 * t.key_bytes()))
        assert moved >= 3_000
    assert t.disk_keys >= 15_000
    assert (t.rows_of(hot) >= 0).all(), "no hot key went to disk"
    got = shard.pull_sparse(T, keys)  # every key still there, whatever its tier
    assert np.count_nonzero(got[:, 0] == 50.0) == hot.size
    shard.close()


class FakeTable:
    """What ``MemoryGovernor.make_room`` and ``enforce`` read of a table."""

    name = "t"

    def __init__(self, ram: int, key_bytes: float) -> None:
        self.ram, self.kb = ram, key_bytes
        self.targets: list[int] = []

    def ram_bytes(self) -> int:
        return self.ram

    def memory_bytes(self) -> int:
        return self.ram

    def key_bytes(self) -> float:
        return self.kb

    def demote(self, target: int) -> int:
        self.targets.append(target)
        moved = max(0, self.ram - target)
        self.ram -= moved
        return int(moved / self.kb)


def test_one_demotion_moves_at_most_a_step_beyond_the_need() -> None:
    big = 4 << 30  # a 4 GiB table budget: 10 % of it would be ~11M keys of 40 B
    table = FakeTable(big, 40.0)
    governor = MemoryGovernor(MemoryBudget.tables_only(big), [table])  # type: ignore[list-item]
    governor.make_room(table, 65_536)  # type: ignore[arg-type]
    step = ml.DEMOTE_STEP_KEYS * 40
    assert table.targets == [big - step - 65_536 * 40]
    table.ram = 2 * big  # far past a (cut) budget: a step a request, not all at once
    governor.make_room(table, 65_536)  # type: ignore[arg-type]
    assert table.targets[-1] == 2 * big - 65_536 * 40 - step
    governor.enforce()
    assert table.targets[-1] == 2 * big - 65_536 * 40 - 2 * step
    small = FakeTable(1 << 20, 40.0)  # 10 % of 1 MiB is less than a step: the 10 % holds
    governor = MemoryGovernor(MemoryBudget.tables_only(1 << 20), [small])  # type: ignore[list-item]
    small.ram += 4_000
    governor.enforce()
    assert small.targets == [(1 << 20) - int((1 << 20) * (1 - ml.LOW_WATER))]
