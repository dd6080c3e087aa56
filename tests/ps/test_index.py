"""The hash index against a Python dict on random keys, including 0 and 2**64 - 1."""

from __future__ import annotations

import mmap

import numpy as np

from streamtrain_ps.engine.index import (
    EMPTY,
    OWN_MAPPING_BYTES,
    HashIndex,
    grown_slots,
    needed_capacity,
    zeros_aligned,
)

EDGE = np.array([0, 2**64 - 1, 1, 2**63], dtype=np.uint64)


def _check(ix: HashIndex, ref: dict[int, int], universe: np.ndarray) -> None:
    rows = ix.lookup(universe)
    expected = np.array([ref.get(int(k), -1) for k in universe], dtype=np.int64)
    np.testing.assert_array_equal(rows, expected)
    assert len(ix) == len(ref)
    assert sorted(ix.rows().tolist()) == sorted(ref.values())


def test_insert_lookup_delete_reuse_match_a_dict() -> None:
    rng = np.random.default_rng(7)
    universe = np.concatenate(
        [EDGE, rng.integers(0, 2**64 - 1, 3000, dtype=np.uint64, endpoint=True)]
    )
    universe = np.unique(universe)
    ix = HashIndex()
    ref: dict[int, int] = {}
    for _ in range(25):
        batch = rng.choice(universe, 700)
        batch[:2] = EDGE[:2]
        rows, created = ix.insert(batch)
        seen: set[int] = set()
        for k, r, c in zip(batch.tolist(), rows.tolist(), created.tolist(), strict=True):
            if k in ref:
                assert ref[k] == r
                assert not c
            else:
                assert c and k not in seen
                ref[k] = r
            seen.add(k)
        gone = rng.choice(universe, 300)
        freed = ix.delete(gone)
        for k, r in zip(gone.tolist(), freed.tolist(), strict=True):
            assert r == ref.pop(k, -1)
        _check(ix, ref, universe)
    # Every row ever handed out is either live or on the free list: rows are reused.
    assert ix.high_water == len(ix) + ix.free_rows
    assert ix.high_water < 25 * 700


def test_freed_rows_are_reused_before_new_ones() -> None:
    ix = HashIndex()
    keys = np.arange(100, dtype=np.uint64)
    ix.insert(keys)
    freed = ix.delete(keys[:40])
    rows, created = ix.insert(np.arange(1000, 1040, dtype=np.uint64))
    assert created.all()
    assert sorted(rows.tolist()) == sorted(freed.tolist())
    assert ix.high_water == 100


def test_growth_keeps_every_key_and_load_factor() -> None:
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 2**64 - 1, 50_000, dtype=np.uint64, endpoint=True))
    ix = HashIndex()
    for chunk in np.array_split(keys, 37):
        ix.insert(chunk)
    assert len(ix) == keys.size
    assert ix.slots.size == needed_capacity(keys.size)
    assert len(ix) <= 0.75 * ix.slots.size
    assert np.count_nonzero(ix.slots != EMPTY) == keys.size
    rows = ix.lookup(keys)
    assert (rows >= 0).all() and np.unique(rows).size == keys.size
    np.testing.assert_array_equal(ix.keys[rows], keys)


def test_delete_everything_then_absent_keys_miss() -> None:
    ix = HashIndex()
    keys = np.concatenate([EDGE, np.arange(10, 5000, dtype=np.uint64)])
    ix.insert(keys)
    assert (ix.delete(keys) >= 0).all()
    assert len(ix) == 0
    assert (ix.lookup(keys) == -1).all()
    assert (ix.delete(keys[:10]) == -1).all()
    assert (ix.slots == EMPTY).all()


def _base(arr: np.ndarray) -> object:
    base: object = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_a_rehash_puts_a_large_slot_array_in_a_mapping_of_its_own() -> None:
    """From ``OWN_MAPPING_BYTES`` up a slot array is an ``mmap`` of its own (unmapped when
    the next rehash frees it), page-aligned and filled like a small one; small ones are
    ordinary numpy arrays."""
    ix = HashIndex()
    ix.insert(np.arange(1, 11, dtype=np.uint64))
    assert ix.slots.nbytes < OWN_MAPPING_BYTES and not isinstance(_base(ix.slots), mmap.mmap)
    large = grown_slots(ix.slots, ix.keys, 400_000)
    assert large.nbytes >= OWN_MAPPING_BYTES
    assert isinstance(_base(large), mmap.mmap)
    assert large.ctypes.data % mmap.PAGESIZE == 0 and large.flags.writeable
    assert np.count_nonzero(large != EMPTY) == 10  # the live rows, rehashed
    aligned = zeros_aligned((OWN_MAPPING_BYTES // 8, 2), np.float32)
    assert isinstance(_base(aligned), mmap.mmap) and not aligned.any()
