"""Compaction after a demotion: the live rows move down into the freed ones, the slabs'
high-water marks drop to the live counts and the freed tail's pages leave the process,
while every key keeps exactly its numbers (the capped-vs-unlimited tests in
test_disk_tier.py run through compactions too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamtrain_ps.api import SparsePush
from streamtrain_ps.engine import address_space
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier import compaction
from streamtrain_ps.tier import tier_kernels as tk
from streamtrain_ps.tier.memory_limit import current_rss_bytes

from .conftest import TIER_DIM as D
from .conftest import TIER_TABLE as T
from .conftest import capped_shard
from .conftest import tier_config as config


def _push(shards: list[Shard], keys: np.ndarray, shows: float) -> None:
    grads = np.random.default_rng(int(keys[0])).normal(0, 1, (keys.size, D + 1))
    s = np.full(keys.size, shows, np.float32)
    for shard in shards:
        shard.push_sparse(T, SparsePush(keys, grads.astype(np.float32), s, 0 * s))


def test_a_demotion_compacts_both_slabs_and_keys_keep_their_numbers(tmp_path: Path) -> None:
    ref = Shard(config())
    capped = capped_shard(tmp_path, 10 << 20)
    t = capped.table(T)
    keys = np.arange(1, 30_001, dtype=np.uint64)
    _push([ref, capped], keys[:10_000], 50.0)  # admitted (threshold 3): embedx rows
    _push([ref, capped], keys[10_000:], 1.0)
    before = capped.pull_sparse(T, keys)
    t.demote(t.ram_bytes() - int(15_000 * t.key_bytes()))
    m = t._meta
    assert t.disk_keys > 5_000
    assert m[ix.NEXT_ROW] == m[ix.COUNT] == len(t) and m[ix.FREE_LEN] == 0
    assert 0 < m[kn.EXPANDED] < 10_000, "some admitted keys went to disk"
    assert m[kn.X_FREE_LEN] == 0 and m[kn.X_NEXT] == m[kn.EXPANDED], "embedx compacted"
    assert t.memory_bytes() <= t.ram_bytes(), "resident follows the live rows"
    ram = keys[t.rows_of(keys) >= 0]
    np.testing.assert_array_equal(capped.pull_sparse(T, ram), ref.pull_sparse(T, ram))
    np.testing.assert_array_equal(capped.pull_sparse(T, keys), before)  # promotes the rest
    _push([ref, capped], np.arange(10**9, 10**9 + 5_000, dtype=np.uint64), 4.0)
    np.testing.assert_array_equal(capped.pull_sparse(T, keys), ref.pull_sparse(T, keys))
    ref.close()
    capped.close()


def test_compaction_carries_touched_bits_and_skips_a_small_embedx_free_share() -> None:
    """The kernel alone on a table's arrays: a moved row keeps its touched bit, released
    rows are untouched, and a few free embedx rows stay on their free list."""
    shard = Shard(config())
    t = shard.table(T)
    admitted = np.arange(1, 5_001, dtype=np.uint64)
    plain = np.arange(10_001, 20_001, dtype=np.uint64)
    _push([shard], admitted, 50.0)
    _push([shard], plain, 1.0)
    a, m = t._arrays, t._meta
    gone = np.concatenate([admitted[:10], plain[::2]])  # 10 embedx rows: < 1/32 of them
    kept = np.setdiff1d(np.concatenate([admitted, plain]), gone)
    want = shard.pull_sparse(T, kept)
    tk.release(a, m, t.rows_of(gone))
    bits = np.zeros(a.keys.shape[0] // 8 + 1, np.uint8)
    high, xhigh = int(m[ix.NEXT_ROW]), int(m[kn.X_NEXT])
    top_keys = kept[-2:]  # in the rows at the top, which must move
    tk.mark_rows(bits, t.rows_of(top_keys), True)
    assert compaction.compact(a, m, bits) > 0
    assert m[ix.NEXT_ROW] == m[ix.COUNT] == kept.size and m[ix.FREE_LEN] == 0
    new_rows = t.rows_of(top_keys)
    assert (new_rows < kept.size).all()
    assert all(tk.touched_bit(bits, r) for r in new_rows), "bits moved with the rows"
    assert not any(tk.touched_bit(bits, r) for r in range(kept.size, high))
    assert m[kn.X_FREE_LEN] == 10 and m[kn.X_NEXT] == xhigh, "embedx left as it was"
    np.testing.assert_array_equal(shard.pull_sparse(T, kept), want)
    _push([shard], np.arange(10**9, 10**9 + 100, dtype=np.uint64), 50.0)  # reuses them
    assert m[kn.X_FREE_LEN] == 0 and m[kn.X_NEXT] == xhigh + 90
    shard.close()


def test_released_rows_leave_the_process_and_read_as_zeros() -> None:
    rows = 64 << 20 >> 5  # 64 MiB of 32-byte rows
    arr = address_space.reserved_zeros(rows, (8,), np.float32)
    arr[:] = 1.0
    resident = current_rss_bytes()
    start = rows // 4 + 3  # not on a page boundary
    address_space.release_rows(arr, start, rows)
    assert resident - current_rss_bytes() > 40 << 20, "the tail's pages went back"
    assert (arr[start:] == 0).all() and (arr[:start] == 1.0).all()
    plain = np.ones((1_000, 3), np.float32)  # not a reservation: zeroed in place
    address_space.release_rows(plain, 10, 20)
    assert (plain[10:20] == 0).all() and plain[:10].all() and plain[20:].all()
