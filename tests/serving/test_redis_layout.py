"""The Redis layout (bucket strings of hash-sorted records, built on the client): equal to the
embedded fold, isolated while the next version is written, nothing left by a cut attempt,
the lookup cache bounded and never crossing versions, memory per key."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from streamtrain_worker.serving.tables import EmbeddedTable, Part, RedisTable
from streamtrain_worker.serving.versions import Version

from .conftest import RedisProcess

WIDTH = 7  # show, click, embed_w + 4 embedx


def version(vid: int, keys: int = 0) -> Version:
    return Version(vid, f"v{vid}", (f"v{vid}",), 0.0, 0.0, {}, keys, True)


def part(
    rng: np.random.Generator, keys: npt.NDArray[np.uint64], tombstones: npt.NDArray[np.uint64]
) -> Part:
    rows = rng.normal(size=(keys.shape[0], WIDTH)).astype(np.float32)
    return keys.astype(np.uint64), rows, tombstones.astype(np.uint64)


def test_versions_equal_the_embedded_fold(redis_server: RedisProcess) -> None:
    rng = np.random.default_rng(3)
    space = rng.integers(1, 2**64 - 1, 6000, dtype=np.uint64)
    redis_table, embedded = RedisTable(redis_server.client, "eq:"), EmbeddedTable()
    # A chain of two parts (a key set, then tombstoned, then set again), then two deltas.
    base = [
        part(rng, space[:4000], space[:0]),
        part(rng, np.concatenate([space[3500:4500], space[:10]]), space[100:200]),
    ]
    writes = [(version(1), None, base)]
    writes.append((version(2), version(1), [part(rng, space[1000:3000], space[4400:4600])]))
    writes.append((version(3), version(2), [part(rng, space[0:50], space[0:40])]))
    probe = np.concatenate([space, rng.integers(1, 2**64 - 1, 100, dtype=np.uint64)])
    for v, unsized, parts in writes:
        parent = None
        if unsized is not None:
            parent = replace(unsized, keys=embedded.table(unsized.id).keys.shape[0])
        count = redis_table.write(v, parent, parts)
        embedded.write(v, parent, parts)
        assert count == embedded.table(v.id).keys.shape[0]
        for vid in range(1, v.id + 1):
            rows, hit = redis_table.lookup(vid, probe)
            expected, expected_hit = embedded.lookup(vid, probe)
            np.testing.assert_array_equal(hit, expected_hit)
            np.testing.assert_array_equal(rows, expected)


def test_the_served_version_is_read_whole_while_the_next_is_written(
    redis_server: RedisProcess,
) -> None:
    rng = np.random.default_rng(5)
    keys = rng.integers(1, 2**64 - 1, 3000, dtype=np.uint64)
    writer = RedisTable(redis_server.client, "iso:")
    first = [part(rng, keys, keys[:0])]
    writer.write(version(1), None, first)
    writer.commit(version(1, 3000), 1)
    reader = RedisTable.connect(redis_server.url, "iso:")  # another server process
    stop, bad, reads = threading.Event(), [], [0]

    def read() -> None:
        while not stop.is_set():
            rows, hit = reader.lookup(reader.served(), keys[:200])
            if not hit.all() or not (
                np.array_equal(rows, first[0][1][:200]) or np.array_equal(rows, second[0][1][:200])
            ):
                bad.append(rows)
            reads[0] += 1

    second = [part(rng, keys, keys[:0])]  # every key changes
    thread = threading.Thread(target=read)
    thread.start()
    try:
        # An attempt cut halfway (half the rows), then the whole write: invisible until commit.
        writer.write(version(2), version(1, 3000), [(keys[:1500], second[0][1][:1500], keys[:0])])
        assert reader.served() == 1
        writer.write(version(2), version(1, 3000), second)
        assert reader.served() == 1
        writer.commit(version(2, 3000), 2)
        while reads[0] < 20:
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join(10)
    assert not bad and reads[0] >= 20
    # The reader's cache holds version 1's buckets: they never answer for version 2.
    np.testing.assert_array_equal(reader.lookup(1, keys)[0], first[0][1])
    np.testing.assert_array_equal(reader.lookup(2, keys)[0], second[0][1])


def test_an_attempt_cut_before_its_map_leaves_no_bucket_behind(
    redis_server: RedisProcess,
) -> None:
    rng = np.random.default_rng(7)
    keys = rng.integers(1, 2**64 - 1, 2000, dtype=np.uint64)
    client = redis_server.client
    table = RedisTable(client, "cut:")
    table.write(version(1), None, [part(rng, keys, keys[:0])])
    table.commit(version(1, 2000), 1)
    table.write(version(2), version(1, 2000), [part(rng, keys[:500], keys[:0])])
    client.delete("cut:map:2")  # killed after its buckets, before its map
    assert table.stored() == {1, 2}
    assert list(client.scan_iter(match="cut:r:2:*"))
    # The delivery drops it (never committed); a fresh process does the same.
    RedisTable(client, "cut:").drop({2})
    assert not list(client.scan_iter(match="cut:r:2:*"))
    # A retry writes it whole again.
    delta = [part(rng, keys[:500], keys[1990:])]
    assert table.write(version(2), version(1, 2000), delta) == 1990
    rows, hit = table.lookup(2, keys)
    np.testing.assert_array_equal(rows[:500], delta[0][1])
    assert hit[:1990].all() and not hit[1990:].any()


def test_the_lookup_cache_stays_within_its_bytes(redis_server: RedisProcess) -> None:
    rng = np.random.default_rng(9)
    keys = rng.integers(1, 2**64 - 1, 4000, dtype=np.uint64)
    rows = part(rng, keys, keys[:0])
    RedisTable(redis_server.client, "lru:").write(version(1), None, [rows])
    small = RedisTable(redis_server.client, "lru:", cache_bytes=8192)
    for start in range(0, 4000, 100):
        got, hit = small.lookup(1, keys[start : start + 100])
        assert hit.all()
        np.testing.assert_array_equal(got, rows[1][start : start + 100])
        assert 0 < small._cache_bytes <= 8192


def test_a_served_key_costs_under_1_5x_its_raw_bytes(redis_server: RedisProcess) -> None:
    rng = np.random.default_rng(11)
    keys = rng.integers(1, 2**64 - 1, 20_000, dtype=np.uint64)
    table = RedisTable(redis_server.client, "mem:")
    table.write(version(1), None, [part(rng, keys, keys[:0])])
    used, rows = table.served_memory(1, WIDTH)
    assert rows == 20_000
    assert used / rows <= 1.5 * (8 + 4 * WIDTH)


def test_warm_reads_ahead_the_buckets_lookups_read(redis_server: RedisProcess) -> None:
    rng = np.random.default_rng(13)
    keys = rng.integers(1, 2**64 - 1, 3000, dtype=np.uint64)
    writer = RedisTable(redis_server.client, "warm:")
    first, second = part(rng, keys, keys[:0]), part(rng, keys, keys[:0])
    writer.write(version(1), None, [first])
    writer.write(version(2), version(1, 3000), [second])
    reader = RedisTable.connect(redis_server.url, "warm:")
    reader.lookup(1, keys[:50])
    reader.warm(2)
    redis_server.client.delete(*redis_server.client.keys("warm:r:2:*"))  # Redis not asked again
    rows, hit = reader.lookup(2, keys[:50])
    assert hit.all()
    np.testing.assert_array_equal(rows, second[1][:50])


def test_a_flushed_and_rewritten_prefix_is_never_answered_from_the_caches(
    redis_server: RedisProcess,
) -> None:
    # Version ids and bucket names repeat when the data under a prefix is flushed and a new
    # delivery writes it again: a running server must not answer from what it cached before.
    rng = np.random.default_rng(9)
    keys = rng.integers(1, 2**64 - 1, 500, dtype=np.uint64)
    server = RedisTable(redis_server.client, "flush:")
    first = RedisTable(redis_server.client, "flush:")
    first.write(version(1), None, [part(rng, keys, keys[:0])])
    first.commit(version(1), cursor=1)
    assert server.served() == 1
    before, _ = server.lookup(1, keys)  # fills the map and bucket caches
    redis_server.client.flushdb()
    again = RedisTable(redis_server.client, "flush:")
    rewritten = part(rng, keys, keys[:0])
    again.write(version(1), None, [rewritten])
    again.commit(version(1), cursor=1)
    assert server.served() == 1
    rows, hit = server.lookup(1, keys)
    assert hit.all()
    np.testing.assert_array_equal(rows, rewritten[1])
    assert not np.array_equal(rows, before)
    # The writer that knew the old data reads parents through its caches too.
    first.write(version(2), version(1, keys=500), [part(rng, keys[:10], keys[:0])])
    fresh, _ = RedisTable(redis_server.client, "flush:").lookup(2, keys[10:])
    np.testing.assert_array_equal(fresh, again.lookup(1, keys[10:])[0])
