"""The in-RAM filter of a table's disk keys: never a false negative (a key on disk must
reach the store), few false positives, grown without rescanning, rebuilt by a shrink;
and a capped shard's pushes of new keys stop asking the store about them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamtrain_ps.engine.slabs import HotCounters
from streamtrain_ps.tier.disk_filter import BITS_PER_KEY, MIN_CAPACITY, DiskKeyFilter
from streamtrain_ps.tier.disk_store import DiskStore

from .conftest import TIER_TABLE as T
from .conftest import capped_shard
from .conftest import tier_step as step


def test_every_added_key_may_be_on_disk_and_few_others_do() -> None:
    rng = np.random.default_rng(3)
    f = DiskKeyFilter()
    added = []
    for n in (500, 3_000, 40_000, 200_000):  # several parts, each larger
        keys = rng.integers(1, 2**64 - 1, n, dtype=np.uint64)
        f.add(keys)
        added.append(keys)
        assert f.maybe(np.concatenate(added)).all(), "a false negative"
    assert len(f._parts) > 1 and f._parts[0].capacity == MIN_CAPACITY
    others = rng.integers(1, 2**64 - 1, 200_000, dtype=np.uint64)
    # about 0.2 % per full part (a query ORs the parts)
    assert f.maybe(others).mean() < 0.004 * len(f._parts)
    # BITS_PER_KEY bits per key of capacity, and the capacity at most twice the keys added
    capacity = sum(p.capacity for p in f._parts)
    assert f.nbytes <= BITS_PER_KEY / 8 * capacity + 64 * len(f._parts)
    assert capacity <= 2 * sum(a.size for a in added)


def test_the_next_part_is_reserved_once_the_last_is_half_full() -> None:
    """The governor sees a part's bytes before the part joins, so the room is shed by
    demotions ahead of it instead of the process passing its limit when it does."""
    f = DiskKeyFilter()
    f.add(np.arange(1, 2 * MIN_CAPACITY + 1, dtype=np.uint64))  # two full parts
    assert f.growth_reserve() > 0  # the last one is full: the next one is due
    before = f.nbytes
    f.add(np.array([10**12], dtype=np.uint64))  # it joins: 2x the keys before it
    assert f.nbytes - before == f._parts[-1].blocks.nbytes and f.growth_reserve() == 0
    joined = f._parts[-1]
    f.add(np.arange(10**13, 10**13 + joined.capacity // 2 - 2, dtype=np.uint64))
    assert f.growth_reserve() == 0, "under half full"
    f.add(np.array([10**14], dtype=np.uint64))
    reserve = f.growth_reserve()
    assert reserve >= BITS_PER_KEY / 8 * sum(p.capacity for p in f._parts)
    f.add(np.arange(10**15, 10**15 + joined.capacity, dtype=np.uint64))  # past it
    assert f._parts[-1].blocks.nbytes == reserve, "what joined is what was reserved"


def test_a_capped_table_keeps_its_disk_keys_in_the_filter(tmp_path: Path) -> None:
    shard = capped_shard(tmp_path, 120_000)
    rng = np.random.default_rng(7)
    for _ in range(40):
        step([shard], rng)
    t = shard.table(T)
    store = t._disk
    assert isinstance(store, DiskStore) and t.disk_keys > 0
    disk_keys = np.concatenate([store.shard_rows(s)[0] for s in range(8)])
    assert t._filter.maybe(disk_keys).all()
    assert t.ram_bytes() >= t._filter.nbytes > 0, "the filter counts in the RAM budget"
    # keys no tier holds are not looked up in the store (the filter rules out nearly all)
    asked: list[int] = []
    real_get = store.get

    def counting_get(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, HotCounters]:
        asked.append(keys.size)
        return real_get(keys)

    store.get = counting_get  # type: ignore[method-assign]
    new = np.arange(10**12, 10**12 + 5_000, dtype=np.uint64)
    out = shard.pull_sparse(T, new)
    assert not out.any()
    assert sum(asked) <= 0.004 * len(t._filter._parts) * new.size
    shard.shrink()
    disk_keys = np.concatenate([store.shard_rows(s)[0] for s in range(8)])
    assert t._filter.maybe(disk_keys).all(), "rebuilt from the live disk keys"
    assert t._filter.nbytes <= BITS_PER_KEY / 8 * max(disk_keys.size, 1024) + 64, "one part"
    shard.close()
