"""What a capped shard process holds beyond its memory split, measured, and given back.

``memory_limit.MemoryBudget`` splits a shard's ``memoryLimit`` into the fixed overhead
(measured at start), RocksDB's cache, the scratch reserve of the requests in flight and the
tables. The split's promise is that between requests the process stays a whole scratch
reserve below its limit, so the requests always fit. Measured over gRPC (``/proc/<pid>/smaps``
and glibc's ``malloc_info`` of a capped shard process at the bench's 4M keys, right after a
``malloc_trim`` with no request in flight, docs/benchmarks.md): it stayed only ~22 MiB below
its limit against a 37.5 MiB reserve. ~16 MiB is held that no share counts: glibc heap
pages kept by live blocks of the store's cache churn and the requests' arrays, RocksDB's
memory outside its cache, gRPC's and the metrics server's buffers. It depends on the
process, its allocator and the load, so it is measured, not estimated:

- **observe** RSS right after the heap was trimmed (``observe``) and take out what the split
  counts at that moment: the fixed overhead, the store's cache as it is used, the tables'
  resident bytes and the requests admitted then (the gate's estimate, an upper bound of
  what they hold). The rest is held beyond the split;
- **give it back**, first from the store's cache (its blocks are heap memory a trim returns
  once evicted: shrinking a 14 MiB cache to 4 MiB lowered the RSS by 9.4 MiB, measured), then
  from the table budget (freed rows stay resident for reuse, so a smaller table budget stops
  the tables from growing into pages the process already needs, it does not shrink them).

The cut is the most ever held beyond the split, not a sum of observations: a table budget
cut does not lower the RSS of rows already resident, so the same excess is seen again at
the next trim and must not be taken twice. Floors bound it: the store keeps
``store_floor``, the tables at least ``tables_floor``. Pure arithmetic;
``memory_limit.MemoryGovernor`` measures and applies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SplitCorrection:
    """The cuts made so far to one shard's split (bytes)."""

    #: What the split counts as fixed: the measured overhead and the tables' page slack.
    fixed: int
    #: The store's cache and the tables as split, and the least each may be cut to.
    store: int
    store_floor: int
    tables: int
    tables_floor: int
    #: The most the process was seen to hold beyond its split.
    held_beyond: int = 0

    @property
    def store_cut(self) -> int:
        return min(self.held_beyond, self.store - self.store_floor)

    @property
    def tables_cut(self) -> int:
        return min(self.held_beyond - self.store_cut, self.tables - self.tables_floor)

    @property
    def store_capacity(self) -> int:
        """What the store's cache may hold now."""
        return self.store - self.store_cut

    @property
    def table_budget(self) -> int:
        """What the tables may hold now."""
        return self.tables - self.tables_cut

    def beyond(self, rss: int, in_flight: int, store_used: int, tables_resident: int) -> int:
        """Bytes of ``rss`` (measured right after a heap trim) that the split does not
        count: not the fixed part, the store's ``store_used`` bytes, the tables'
        ``tables_resident`` bytes nor the ``in_flight`` requests' bytes."""
        return rss - self.fixed - store_used - tables_resident - in_flight

    def observe(self, rss: int, in_flight: int, store_used: int, tables_resident: int) -> int:
        """Note what the process holds beyond its split now; returns the bytes newly cut
        from the store's cache and the table budget (0: nothing changed)."""
        before = self.store_cut + self.tables_cut
        held = self.beyond(rss, in_flight, store_used, tables_resident)
        self.held_beyond = max(self.held_beyond, held)
        return self.store_cut + self.tables_cut - before
