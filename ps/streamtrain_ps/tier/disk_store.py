"""The disk tier's storage: full rows of one table's cold keys in an embedded RocksDB.

Why RocksDB (``rocksdict``) and not LMDB: ``docs/decisions.md`` (measured: 2x the batch put
rate, 1.5x the batch get rate and 3.6x fewer disk bytes per key for random 64-bit keys).

What is stored is exactly what a checkpoint stores: the key's *full* row (float32, the
logical layout ``accessor.RowLayout.columns``) and, for a hot key, its exact float64
counters — so a key restored from disk continues bit for bit as if it had never left RAM.

- key: logical shard (u16, big-endian) + key (u64, big-endian), so a save reads one
  logical shard's rows by one range scan;
- value: the row's ``width * 4`` bytes, plus 24 bytes of float64 (show, click,
  delta_score) for a hot key (told apart by the length).

The content is a spill area of a running process, not a durable copy (checkpoints are): the
write-ahead log is off, and opening a path wipes what an earlier process left there.
A size cap (``limit_bytes``) is enforced here, by the live bytes this store accounts, since
RocksDB's own space limit is not exposed by the binding; ``put`` refuses what would pass it
(``DiskFullError``), and a filesystem that runs out first raises the same error.

RocksDB's memory is bounded explicitly (``StoreMemory``): one LRU block cache per shard,
shared by every table's store, holds the data blocks, the index and bloom-filter blocks and
(through a write-buffer manager) the memtables, so the store's RAM is one number that the
shard's memory limit counts (``memory_limit``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.engine.slabs import HotCounters
from streamtrain_ps.sharding import logical_shard

#: Bytes per stored key besides its row: the 10-byte store key plus RocksDB's per-entry
#: overhead after compaction (measured: ~118 B on disk for a 108-byte entry).
ENTRY_OVERHEAD = 20
HOT_BYTES = 24
#: Keys per RocksDB write: each key is a few Python objects while it is in flight.
BATCH_KEYS = 8192
#: Keys per RocksDB multi-get. A multi-get pins the data block of each of its keys in the
#: block cache until it returns (random keys: a 4 KiB block each), past the cache's
#: capacity: 8,192 keys pinned ~30 MB at once, measured as a capped shard's RSS going
#: ~26 MB past its limit in a push of disk keys; 1,024 pin ~4 MB at the same speed.
GET_BATCH_KEYS = 1024
#: The smallest RAM budget a shard's stores get (a memtable needs a few MiB to be useful).
MIN_STORE_MEMORY = 4 << 20


class StoreMemory:
    """One shard's RocksDB memory budget: an LRU cache of ``budget_bytes`` that holds every
    store's blocks (data, index, filters) and, charged through a write-buffer manager, their
    memtables (at most half the budget). Shared by the stores of all tables of a shard."""

    def __init__(self, budget_bytes: int) -> None:
        from rocksdict import Cache, WriteBufferManager

        self.budget_bytes = max(int(budget_bytes), MIN_STORE_MEMORY)
        #: What the cache may hold now (``set_capacity``; at first the whole budget).
        self.capacity_bytes = self.budget_bytes
        self.cache: Any = Cache(self.budget_bytes)
        self.write_buffers: Any = WriteBufferManager.new_write_buffer_manager_with_cache(
            self.budget_bytes // 2, False, self.cache
        )

    @property
    def memtable_bytes(self) -> int:
        """One memtable's size: two per store fit the write-buffer share several times."""
        return max(1 << 20, self.budget_bytes // 4)

    def set_capacity(self, capacity_bytes: int) -> None:
        """Let the cache hold ``capacity_bytes`` from now (it evicts down to it as blocks
        are released): what a capped shard gives back when its process was measured to
        hold more than its split (``memory_feedback``)."""
        self.capacity_bytes = max(int(capacity_bytes), MIN_STORE_MEMORY)
        self.cache.set_capacity(self.capacity_bytes)

    def usage(self) -> int:
        """Bytes the cache holds now (blocks plus memtable reservations)."""
        return int(self.cache.get_usage())


class DiskFullError(OSError):
    """The disk tier is at its cap (or its filesystem is full)."""


class DiskStore:
    """Full rows of one table's disk-resident keys. Thread-safe (RocksDB is); the table's
    locks decide who may change which keys."""

    def __init__(
        self,
        path: Path,
        width: int,
        logical_shards: int,
        limit_bytes: int = 0,
        memory: StoreMemory | None = None,
        foreign_bytes: int = 0,
    ) -> None:
        """``foreign_bytes``: bytes on the tier's volume that are not this store's (other
        files, other tables' stores, as measured when it opens): the cap counts them too,
        since the volume is sized for the cap and fills up whoever wrote the bytes."""
        from rocksdict import BlockBasedIndexType, BlockBasedOptions, Options, Rdict, WriteOptions

        shutil.rmtree(path, ignore_errors=True)  # a spill area: nothing to recover
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.width = width
        self.limit_bytes = limit_bytes
        self.foreign_bytes = foreign_bytes
        self._L = logical_shards
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        memory = memory or StoreMemory(MIN_STORE_MEMORY)
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)  # a lookup skips the levels without its key
        # Index and filter blocks live in the bounded cache too (not in unbounded table
        # readers): 100M keys' bloom filters alone would be 125 MB. *Partitioned*, so each
        # is a few KiB: a whole filter of a large file does not fit in one shard of a small
        # cache and was read back from the file on every lookup (measured: 300 µs a get).
        table.set_block_cache(memory.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_metadata_block_size(4096)
        table.set_pin_top_level_index_and_filter(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        # The table's own RAM filter (``disk_filter``) rules out keys that are in no tier,
        # so the store's lookups are nearly all hits: no filter for the last level.
        opts.set_optimize_filters_for_hits(True)
        opts.set_write_buffer_manager(memory.write_buffers)
        opts.set_write_buffer_size(memory.memtable_bytes)
        opts.set_max_write_buffer_number(2)
        self._db: Any = Rdict(str(path), opts)
        self._wo = WriteOptions()
        self._wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property
        self._count = 0
        self._hot = 0

    # -- accounting -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    @property
    def row_bytes(self) -> int:
        return self.width * 4 + ENTRY_OVERHEAD

    def stored_bytes(self) -> int:
        """Live bytes of the stored keys (what the cap counts)."""
        return self._count * self.row_bytes + self._hot * HOT_BYTES

    def room(self) -> int:
        """How many more ordinary keys fit under the cap (a large number when uncapped)."""
        if self.limit_bytes <= 0:
            return 1 << 62
        used = self.stored_bytes() + self.foreign_bytes
        return max(0, (self.limit_bytes - used) // self.row_bytes)

    # -- rows -------------------------------------------------------------------------------

    def _store_keys(self, keys: npt.NDArray[np.uint64]) -> list[bytes]:
        packed = np.empty(keys.size, dtype=[("s", ">u2"), ("k", ">u8")])
        packed["s"] = logical_shard(keys, self._L)
        packed["k"] = keys
        keys_bytes: list[bytes] = packed.view("V10").tolist()  # one bytes object per key
        return keys_bytes

    def _store_order(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The permutation that sorts ``keys`` as the store does (logical shard, key)."""
        return np.lexsort((keys, logical_shard(keys, self._L))).astype(np.int64)

    def put(
        self, keys: npt.NDArray[np.uint64], rows: npt.NDArray[np.float32], hot: HotCounters
    ) -> None:
        """Store ``keys`` (none of them stored yet) with their full rows and hot counters.
        Raises ``DiskFullError`` (nothing written) if they would pass the cap or the
        filesystem is full."""
        from rocksdict import WriteBatch

        if not keys.size:
            return
        extra = keys.size * self.row_bytes + hot.positions.size * HOT_BYTES
        used = self.stored_bytes() + self.foreign_bytes
        if self.limit_bytes > 0 and used + extra > self.limit_bytes:
            raise DiskFullError(
                f"disk tier {self.path} at its cap of {self.limit_bytes} bytes "
                f"({self.foreign_bytes} of them held by other files on its volume)"
            )
        # Written in store order: sorted inserts into the memtable are 2-2.5x faster than
        # random ones (measured with 8k-key batches of random keys).
        order = self._store_order(keys)
        hot_at = np.full(keys.size, -1, dtype=np.int64)
        hot_at[hot.positions] = np.arange(hot.positions.size)
        for lo in range(0, keys.size, BATCH_KEYS):  # bounded Python objects per batch
            idx = order[lo : lo + BATCH_KEYS]
            h = hot_at[idx]
            hot_here = HotCounters(np.flatnonzero(h >= 0), hot.counts[h[h >= 0]])
            values = _encode(np.ascontiguousarray(rows[idx], dtype=np.float32), hot_here)
            batch = WriteBatch(raw_mode=True)
            put = batch.put
            for sk, v in zip(self._store_keys(keys[idx]), values, strict=True):
                put(sk, v)
            self._write(batch)
        self._count += int(keys.size)
        self._hot += int(hot.positions.size)

    def replace(
        self, keys: npt.NDArray[np.uint64], rows: npt.NDArray[np.float32], hot: HotCounters
    ) -> None:
        """Overwrite stored keys' rows (a shrink or a save's side effects on disk rows)."""
        old_hot = self.get(keys)[2].positions.size
        limit, self.limit_bytes = self.limit_bytes, 0  # rewriting never needs more room
        try:
            self.put(keys, rows, hot)  # counts them again only once all is written
        finally:
            self.limit_bytes = limit
        self._count -= int(keys.size)
        self._hot -= old_hot

    def get(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float32], HotCounters]:
        """(found, rows of the found keys in order, their hot counters: positions index
        those rows)."""
        found = np.zeros(keys.size, dtype=np.bool_)
        if not keys.size or not self._count:
            return found, np.empty((0, self.width), np.float32), _no_hot()
        # Looked up in store order (nearby keys share blocks: ~2x the rate of random order).
        order = self._store_order(keys)
        parts = []
        for lo in range(0, keys.size, GET_BATCH_KEYS):  # bounded pinned blocks per call
            values = self._db.get(self._store_keys(keys[order[lo : lo + GET_BATCH_KEYS]]))
            parts.append(self._decode(values, found[lo : lo + GET_BATCH_KEYS]))
        rows_sorted = np.concatenate([p[0] for p in parts])
        hot_sorted = _concat_hot([p[1] for p in parts], [p[0].shape[0] for p in parts])
        found_sorted = found.copy()
        found[order] = found_sorted
        # Rows back in the caller's key order: the i-th found row of sorted order belongs to
        # key order[found_sorted][i].
        where = order[found_sorted]
        back = np.argsort(where, kind="stable")
        rank = np.empty(back.size, dtype=np.int64)
        rank[back] = np.arange(back.size)
        rows = rows_sorted[back]
        hot = HotCounters(rank[hot_sorted.positions], hot_sorted.counts)
        return found, rows, _sorted_hot(hot)

    def _decode(
        self, values: list[bytes | None], found: npt.NDArray[np.bool_]
    ) -> tuple[npt.NDArray[np.float32], HotCounters]:
        """Rows (and hot counters) of the non-None ``values``, whose places it marks in
        ``found``: one join and numpy slicing, not Python per row."""
        nb = self.width * 4
        found[:] = np.fromiter((v is not None for v in values), np.bool_, len(values))
        present = [v for v in values if v is not None]
        raw = np.frombuffer(b"".join(present), np.uint8)
        lengths = np.fromiter(map(len, present), np.int64, len(present))
        if not (lengths > nb).any():  # no hot key: the rows are back to back
            rows = raw.view(np.float32).reshape(len(present), self.width).copy()
            return rows, _no_hot()
        starts = np.cumsum(lengths) - lengths
        rows = raw[starts[:, None] + np.arange(nb)].view(np.float32).reshape(-1, self.width)
        pos = np.flatnonzero(lengths > nb)
        counts = raw[starts[pos, None] + nb + np.arange(HOT_BYTES)].view(np.float64)
        return rows, HotCounters(pos.astype(np.int64), counts.reshape(-1, 3))

    def delete(self, keys: npt.NDArray[np.uint64], hot_keys: int | None = None) -> None:
        """Remove stored keys (each must be stored). ``hot_keys``: how many of them carry
        exact counters, when the caller knows (a promotion read them); else read here."""
        from rocksdict import WriteBatch

        if not keys.size:
            return
        nhot = self.get(keys)[2].positions.size if hot_keys is None else hot_keys
        batch = WriteBatch(raw_mode=True)
        for sk in self._store_keys(keys[self._store_order(keys)]):
            batch.delete(sk)
        self._write(batch)
        self._count -= int(keys.size)
        self._hot -= nhot

    def shard_rows(
        self, logical: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]:
        """Every stored key of one logical shard with its row and hot counters."""
        if not self._count:
            return np.empty(0, np.uint64), np.empty((0, self.width), np.float32), _no_hot()
        prefix = int(logical).to_bytes(2, "big")
        keys: list[bytes] = []
        values: list[bytes | None] = []
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if k[:2] != prefix:
                break
            keys.append(k[2:])
            values.append(it.value())
            it.next()
        del it
        found = np.zeros(len(values), dtype=np.bool_)
        rows, hot = self._decode(values, found)
        return np.frombuffer(b"".join(keys), ">u8").astype(np.uint64), rows, hot

    def _write(self, batch: Any) -> None:
        try:
            self._db.write(batch, self._wo)
        except Exception as exc:  # the binding raises a plain exception with RocksDB's text
            if "space" in str(exc).lower() or "ENOSPC" in str(exc):
                raise DiskFullError(f"disk tier {self.path}: {exc}") from exc
            raise

    def close(self, remove: bool = True) -> None:
        """Close the store and (by default) delete its files."""
        self._db.close()
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)


def tree_bytes(path: Path) -> int:
    """Bytes of the files below ``path`` (0 if it does not exist); what a spill volume
    holds besides a store."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _encode(rows: npt.NDArray[np.float32], hot: HotCounters) -> list[bytes]:
    """One value per row: its bytes, plus its exact float64 counters for a hot row. Sliced
    out of one buffer (numpy encodes; Python only cuts)."""
    values: list[bytes] = rows.view(f"V{rows.shape[1] * 4}").ravel().tolist()
    counts = np.ascontiguousarray(hot.counts, np.float64)
    for p, c in zip(hot.positions.tolist(), counts, strict=True):
        values[p] += c.tobytes()
    return values


def _no_hot() -> HotCounters:
    return HotCounters(np.empty(0, np.int64), np.empty((0, 3), np.float64))


def _concat_hot(parts: list[HotCounters], sizes: list[int]) -> HotCounters:
    """Hot counters of concatenated row blocks (positions shifted by the blocks before)."""
    starts = np.cumsum([0, *sizes[:-1]])
    return HotCounters(
        np.concatenate([h.positions + s for h, s in zip(parts, starts, strict=True)]),
        np.concatenate([h.counts for h in parts]).reshape(-1, 3),
    )


def _sorted_hot(hot: HotCounters) -> HotCounters:
    order = np.argsort(hot.positions)
    return HotCounters(hot.positions[order], hot.counts[order])
