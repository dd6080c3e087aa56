"""Many threads on one shard: exact totals, and readers that never see a broken table."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.engine import table as table_module
from streamtrain_ps.errors import InvalidRequestError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

D = 4
T = "embedding"


def _run(workers: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    if errors:
        raise errors[0]


def test_concurrent_pushers_of_the_same_keys_keep_exact_totals() -> None:
    shard = Shard(
        PSConfig(tables=(TableConfig(embedxDim=D, embedxThreshold=3.0),), logicalShards=8)
    )
    keys = np.arange(5000, dtype=np.uint64) * np.uint64(7919)
    n_threads, rounds = 6, 30

    def pusher(seed: int) -> Callable[[], None]:
        def run() -> None:
            rng = np.random.default_rng(seed)
            for _ in range(rounds):
                k = np.concatenate([keys, keys[:100]])  # duplicates inside one request too
                shard.push_sparse(
                    T,
                    SparsePush(
                        k,
                        rng.normal(size=(k.size, D + 1)).astype(np.float32),
                        np.ones(k.size, np.float32),
                        np.full(k.size, 0.5, np.float32),
                    ),
                )

        return run

    _run([pusher(i) for i in range(n_threads)])
    out = shard.pull_sparse(T, keys)
    per_key = n_threads * rounds * np.where(np.arange(keys.size) < 100, 2, 1)
    np.testing.assert_array_equal(out[:, 0], per_key)
    np.testing.assert_array_equal(out[:, 1], per_key * 0.5)
    stats = shard.stats().tables[0]
    assert stats.keys == keys.size and stats.expanded_keys == keys.size


def test_pulls_during_growth_saves_and_shrinks_see_consistent_rows(tmp_path: Path) -> None:
    cfg = PSConfig(
        tables=(
            TableConfig(
                embedxDim=D,
                showClickDecayRate=1.0,
                deleteThreshold=-1.0,
                deleteAfterUnseenDays=10**6,
            ),
        ),
        logicalShards=8,
    )
    shard = Shard(cfg)
    hot = np.arange(1, 2001, dtype=np.uint64)
    z = np.zeros((hot.size, D + 1), np.float32)
    shard.push_sparse(
        T, SparsePush(hot, z, np.ones(hot.size, np.float32), np.zeros(hot.size, np.float32))
    )
    stop = threading.Event()
    grow_rounds = 40

    def grower() -> None:  # new keys: the index and slabs reallocate under the readers
        try:
            for r in range(grow_rounds):
                k = np.arange(10_000, dtype=np.uint64) + np.uint64(1_000_000 * (r + 1))
                shard.push_sparse(
                    T,
                    SparsePush(
                        k,
                        np.zeros((k.size, D + 1), np.float32),
                        np.ones(k.size, np.float32),
                        np.zeros(k.size, np.float32),
                    ),
                )
                shard.push_sparse(
                    T,
                    SparsePush(
                        hot, z, np.ones(hot.size, np.float32), np.zeros(hot.size, np.float32)
                    ),
                )
        finally:
            stop.set()

    def reader() -> None:
        last = np.ones(hot.size, np.float32)
        while not stop.is_set():
            shows = shard.pull_sparse(T, hot)[:, 0]
            assert (shows >= last).all(), "a hot key's show count never goes back or vanishes"
            last = shows

    def maintenance() -> None:
        i = 0
        while not stop.is_set():
            uri = str(tmp_path / f"s{i}")
            checkpoint.publish(uri, [shard.save(uri, SaveMode.BATCH)], config=cfg)
            shard.shrink()
            i += 1

    _run([grower, reader, reader, maintenance])
    np.testing.assert_array_equal(shard.pull_sparse(T, hot)[:, 0], grow_rounds + 1)
    assert shard.stats().tables[0].keys == hot.size + grow_rounds * 10_000


def test_chunked_and_two_thread_pushes_and_pulls_equal_single_threaded_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = PSConfig(tables=(TableConfig(embedxDim=D, embedxThreshold=2.0),), logicalShards=8)
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True)
    batches = []
    for _ in range(4):
        k = rng.choice(keys, 30_000)
        batches.append(
            (
                k,
                rng.normal(size=(k.size, D + 1)).astype(np.float32),
                rng.integers(0, 3, k.size).astype(np.float32),
                (rng.random(k.size) < 0.3).astype(np.float32),
            )
        )
    results = []
    # One go on one thread / chunks of 3000 merged keys, each split over two threads.
    for split_at, chunk in ((10**9, 10**9), (1, 3000)):
        monkeypatch.setattr(table_module, "SPLIT_MIN_KEYS", split_at)
        monkeypatch.setattr(table_module, "APPLY_CHUNK", chunk)
        shard = Shard(cfg)
        for b in batches:
            shard.push_sparse(T, SparsePush(*b))
        results.append((shard.pull_sparse(T, keys), shard.stats().tables[0]))
        shard.close()
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1].expanded_keys == results[1][1].expanded_keys > 0


def test_a_bad_row_seen_by_either_merge_thread_rejects_the_whole_push(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table_module, "SPLIT_MIN_KEYS", 1)
    shard = Shard(PSConfig(tables=(TableConfig(embedxDim=D),), logicalShards=8))
    n = 1000
    keys = np.arange(n, dtype=np.uint64)
    for bad in (0, n // 2, n - 1):
        grads = np.zeros((n, D + 1), np.float32)
        grads[bad, 2] = np.inf
        with pytest.raises(InvalidRequestError, match=f"row {bad} "):
            shard.push_sparse(
                T, SparsePush(keys, grads, np.ones(n, np.float32), np.zeros(n, np.float32))
            )
    assert shard.stats().tables[0].keys == 0
    shard.close()
