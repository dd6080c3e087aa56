"""A shard's memory limit: keep the shard *process* under ``PSConfig.memoryLimit`` by
demoting the coldest keys of its tables to the disk tier (``tiering``), and refuse what
could never fit.

The limit is a process budget (``docs/decisions.md``, "The memory limit is a process
budget"): the shard's resident set size should never pass it. ``MemoryBudget.measure``
splits it when the shard starts:

- **fixed overhead**: the process's RSS measured after every kernel was compiled (or loaded
  from numba's cache) and the disk tier's library loaded (interpreter, numpy, numba/LLVM,
  RocksDB code); measured, not configured;
- **store**: RocksDB's block cache, index and filter blocks and memtables, all in one LRU
  cache of this size (``disk_store.StoreMemory``);
- **scratch**: requests in flight, sized from the largest request the shard admits
  (``request_scratch_bytes``: ``maxKeysPerRequest`` keys at a measured cost per key, their
  messages included) times the requests the shard serves at once (``requests_in_flight``,
  a gate in the servicer), plus RocksDB's memory outside its cache;
- **tables**: the rest. The governor keeps the tables' resident bytes under it: before a
  request it demotes so that the table's live bytes plus the request's keys fit, and the
  table's slabs are sized for the budget up front (untouched pages cost nothing), so
  reaching the budget never copies a slab.

A demotion compacts the slabs and gives the freed rows' pages back (``compaction``), so the
resident table follows its live rows, and the filter of the disk keys, which grows with
every key sent to disk, takes its room from them. What the split cannot see (heap pages
kept by live blocks, gRPC's and RocksDB's memory outside the cache, code paths first run
later) is measured: after each heap trim the governor compares the RSS with the split and
gives what it holds beyond it back from the store's cache, then from the table budget
(``memory_feedback``). After each demotion it trims the heap and logs a warning if the RSS
passed the limit anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import resource
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamtrain_ps.config import CAPPED_REQUEST_KEYS, PSConfig
from streamtrain_ps.errors import MemoryLimitError, WorkingSet  # the error lives in errors
from streamtrain_ps.plumbing.heap import release_scratch_memory
from streamtrain_ps.tier.disk_store import MIN_STORE_MEMORY, StoreMemory
from streamtrain_ps.tier.memory_feedback import SplitCorrection
from streamtrain_ps.tier.tiering import TieredTable

log = logging.getLogger(__name__)

#: Demotion stops at this share of the table budget, so it runs once per few percent of growth
#: (for a load: the share a table's keys may take before the rest goes to disk)...
LOW_WATER = 0.9
#: ... but a demotion moves at most this many keys beyond what the request needs (a larger
#: excess, after the table budget was cut, goes a step a request): it holds the writer lock
#: and writes every key to RocksDB (~0.3-0.5M keys/s here), so 10 % of a 100M-key shard's
#: RAM keys at once stalled requests past their deadline.
DEMOTE_STEP_KEYS = 262_144
#: A single request may use at most this share of the table budget.
MAX_REQUEST_SHARE = 0.5
#: Shares of (limit - fixed overhead) for the store's cache and for requests' scratch (the
#: share only when the request size is not known; else: the most requests in flight take).
STORE_SHARE = 0.125
SCRATCH_SHARE = 0.3
MIN_SCRATCH = 16 << 20
#: Bytes one key of a PullSparse/PushSparse request holds while the shard serves it: fixed,
#: and per column of the pushed row (``push_dim``). Measured with tracemalloc on a capped
#: shard (65,536 keys, promotions and demotions in the request): 215-247 B at push_dim 9,
#: 940-1,134 B at 65 (decoded and merged arrays, the pull's output and its encoding), plus
#: the request and response messages gRPC holds (two copies: ~8 B per column + 40).
REQUEST_FIXED_BYTES_PER_KEY = 144
REQUEST_BYTES_PER_COLUMN = 24
#: Wire bytes of one pushed key besides its row: key, show, click (``remote``).
PUSH_WIRE_FIXED_BYTES = 20
#: RocksDB's memory outside its block cache (compaction's input and output buffers, table
#: readers, the memtables' arena past their charge), measured on a capped shard.
STORE_OUTSIDE_CACHE = 8 << 20
#: RPC threads of a capped shard besides the requests in flight: a control RPC (a save,
#: stats, health) never queues behind pulls; a thread waiting at the gate holds one
#: received message, which the scratch reserve counts.
SPARE_RPC_THREADS = 2
MAX_STORE = 256 << 20
#: What the process was measured to hold beyond its split may cut the table budget down to
#: this share of it, no further (``memory_feedback``).
MIN_TABLE_SHARE = 0.5
#: A limit must leave at least this much for the tables after the rest.
MIN_TABLE_BUDGET = 8 << 20
#: Resident memory of one table beyond its accounted bytes: its key column and two slabs are
#: reservations backed by transparent huge pages (``address_space``), so the last, partly
#: written 2 MiB page of each is resident whole.
HUGE_PAGE_SLACK_PER_TABLE = 3 * (2 << 20)
#: After a request, the heap is trimmed once the process's RSS is within this share of the
#: scratch reserve from the limit (``MemoryGovernor.enforce``)...
TRIM_MARGIN_SHARE = 0.5
#: ...and, when a trim could not bring it below that, again only after it grew this much.
TRIM_STEP = 8 << 20
#: glibc's ``mallopt`` parameter: allocations from this size up are mapped on their own.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20
#: glibc's ``mallopt`` parameter: how many heaps (arenas) threads allocate from.
_M_ARENA_MAX = -8
ARENA_MAX = 2


#: The disk tier counts as full from this share of ``diskLimit`` (it evicts a little below).
DISK_FULL_SHARE = 0.95


@dataclass(frozen=True)
class MemoryBudget:
    """How one shard's ``memoryLimit`` is split (bytes; ``limit`` 0: unlimited)."""

    limit: int
    fixed_overhead: int
    store: int
    scratch: int
    tables: int
    #: Sparse requests served at once (the servicer's gate; 0: not bounded).
    requests_in_flight: int = 0
    #: Scratch of one request at the largest size admitted, and of its message alone.
    request_bytes: int = 0
    message_bytes: int = 0

    @classmethod
    def unlimited(cls) -> MemoryBudget:
        return cls(0, 0, 0, 0, 0)

    @property
    def rpc_threads(self) -> int:
        """RPC threads the shard's server may run (0: its default): the requests in flight
        plus ``SPARE_RPC_THREADS``, so no more messages arrive than the reserve counts."""
        return self.requests_in_flight + SPARE_RPC_THREADS if self.requests_in_flight else 0

    @classmethod
    def tables_only(cls, limit: int) -> MemoryBudget:
        """The whole limit for the tables (tests that exercise tier moves with tiny tables
        inject this; the process's own memory is then not bounded)."""
        return cls(limit, 0, 0, 0, limit)

    @classmethod
    def measure(
        cls,
        limit: int,
        fixed_overhead: int | None = None,
        num_tables: int = 1,
        request: tuple[int, int] = (0, 0),
    ) -> MemoryBudget:
        """Split ``limit`` after measuring the process's RSS now (call once the kernels are
        warm). ``request``: (scratch bytes of the largest request admitted, bytes of its
        message), ``request_scratch_bytes``; (0, 0): unknown, a share of the limit.
        Raises ``MemoryLimitError`` naming the field if too little is left."""
        if not limit:
            return cls.unlimited()
        base = current_rss_bytes() if fixed_overhead is None else fixed_overhead
        rest = limit - base
        store = min(MAX_STORE, int(rest * STORE_SHARE))
        request_bytes, message_bytes = request
        in_flight = 0
        if request_bytes:
            # As many requests at once as the scratch share holds, one at the least, at
            # most one per core (more would only queue for the cores).
            fit = int(rest * SCRATCH_SHARE) // (request_bytes + message_bytes)
            in_flight = max(1, min(os.cpu_count() or 1, fit))
            waiting = in_flight + SPARE_RPC_THREADS - 1  # messages held at the gate
            scratch = in_flight * request_bytes + waiting * message_bytes + STORE_OUTSIDE_CACHE
        else:
            scratch = max(MIN_SCRATCH, int(rest * SCRATCH_SHARE))
        tables = rest - store - scratch - num_tables * HUGE_PAGE_SLACK_PER_TABLE
        if tables < MIN_TABLE_BUDGET:
            requests = (
                f"{scratch} for {in_flight} request(s) in flight of the most keys a request "
                f"may carry ({request_bytes} bytes each; a smaller maxKeysPerRequest needs less)"
                if request_bytes
                else f"{scratch} for requests in flight"
            )
            raise MemoryLimitError(
                f"spec.ps.memoryLimit ({limit} bytes) is below what the shard process needs: "
                f"{base} bytes measured at start (interpreter, numba kernels, RocksDB), "
                f"{max(store, 0)} for the disk tier's cache, {requests} "
                f"and at least {MIN_TABLE_BUDGET} for the tables; raise it to at least "
                f"{base + max(store, 0) + scratch + MIN_TABLE_BUDGET}"
            )
        return cls(limit, base, store, scratch, tables, in_flight, request_bytes, message_bytes)

    def limit_for_tables(self, tables: int, num_tables: int = 1) -> int:
        """The smallest limit (rounded up to MiB) whose split leaves ``tables`` bytes for the
        tables, with this budget's measured fixed overhead: what to tell an operator."""
        if not self.fixed_overhead and not self.scratch:  # ``tables_only``: no split
            return _mib_up(tables)
        lo = self.fixed_overhead // _MIB  # in MiB: never enough (nothing is left)
        hi = max(lo, self.limit // _MIB) * 2 + 1
        while self._tables_at(hi, num_tables) < tables:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self._tables_at(mid, num_tables) >= tables else (mid, hi)
        return hi * _MIB

    def _tables_at(self, mib: int, num_tables: int) -> int:
        try:
            request = (self.request_bytes, self.message_bytes)
            return MemoryBudget.measure(mib * _MIB, self.fixed_overhead, num_tables, request).tables
        except MemoryLimitError:
            return 0


_MIB = 1 << 20


def _push_wire_bytes_per_key(config: PSConfig) -> int:
    """Wire bytes of one pushed key of the widest table: key, show, click and its row."""
    return PUSH_WIRE_FIXED_BYTES + 4 * max((t.push_dim for t in config.tables), default=0)


def request_bytes_per_key(config: PSConfig) -> int:
    """Scratch one key of a sparse request holds in flight, for the widest table."""
    widest = max((t.push_dim for t in config.tables), default=0)
    return REQUEST_FIXED_BYTES_PER_KEY + REQUEST_BYTES_PER_COLUMN * widest


def capped_request_keys(config: PSConfig) -> int:
    """Most keys a capped shard admits in one sparse request: ``maxKeysPerRequest``, but
    no more than ``CAPPED_REQUEST_KEYS`` (the 4M-key default would need a reserve of ~1.4 GB
    at embedxDim 8) nor than ``maxMessageBytes`` carries."""
    by_bytes = config.maxMessageBytes // _push_wire_bytes_per_key(config)
    return min(config.maxKeysPerRequest, CAPPED_REQUEST_KEYS, by_bytes)


def request_scratch_bytes(config: PSConfig) -> tuple[int, int]:
    """(scratch, message bytes) of the largest sparse request a capped shard with
    ``config`` admits (``capped_request_keys``) for its widest table."""
    keys = capped_request_keys(config)
    return keys * request_bytes_per_key(config), keys * _push_wire_bytes_per_key(config)


def _mib_up(n: int) -> int:
    return -(-n // _MIB) * _MIB


class MemoryGovernor:
    """Applies one shard's ``MemoryBudget`` to its tables.

    With a process budget (a measured fixed overhead) it also checks the split against the
    process's RSS after each heap trim (``observe_after_trim``) and gives back what the
    process holds beyond it, from the store's cache (``store``) and the table budget
    (``memory_feedback``); ``in_flight`` tells the bytes of the requests admitted now.
    """

    def __init__(
        self,
        budget: MemoryBudget,
        tables: Sequence[TieredTable],
        disk_limit: int = 0,
        *,
        store: StoreMemory | None = None,
        in_flight: Callable[[], int] = lambda: 0,
    ) -> None:
        self.budget = budget
        #: ``diskLimit`` of each table's disk tier (0: no cap), for a refusal's numbers.
        self.disk_limit = disk_limit
        self.limit = budget.limit
        self._store = store
        self._in_flight = in_flight
        #: The split's cuts after measuring the process (None: not a process budget).
        self.correction: SplitCorrection | None = None
        if self.limit and budget.fixed_overhead:
            store_bytes = store.budget_bytes if store is not None else 0
            slack = len(tables) * HUGE_PAGE_SLACK_PER_TABLE
            self.correction = SplitCorrection(
                fixed=budget.fixed_overhead + slack,
                store=store_bytes,
                store_floor=min(store_bytes, MIN_STORE_MEMORY),
                tables=budget.tables,
                tables_floor=int(budget.tables * MIN_TABLE_SHARE),
            )
        self._correcting = threading.Lock()
        self._tables = list(tables)
        #: The largest working set (bytes of one request's unique keys) seen.
        self.working_set_bytes = 0
        self._spilled: set[str] = set()
        #: RSS right after the last trim that left it above the trim mark (0: none).
        self._trimmed_at = 0
        if self.limit:
            for t in self._tables:
                t.after_move = self.trim_near_limit

    @property
    def table_budget(self) -> int:
        """Bytes the tables may hold: the split's, less what the process was measured to
        hold beyond its split (``observe_after_trim``)."""
        c = self.correction
        return self.budget.tables if c is None else c.table_budget

    def release_memory(self) -> None:
        """Give freed heap pages back to the OS, then check the split against what the
        process holds (``observe_after_trim``)."""
        release_scratch_memory()
        self.observe_after_trim()

    def observe_after_trim(self) -> int:
        """Right after the heap was trimmed: compare the process's RSS with its split and
        give back what it holds beyond it (the store's cache first, then the table budget,
        which the next ``enforce`` demotes to). Returns the bytes cut (0: within it)."""
        c = self.correction
        if c is None:
            return 0
        with self._correcting:
            rss = current_rss_bytes()
            in_flight = self._in_flight()
            store_used = self._store.usage() if self._store is not None else 0
            tables = sum(t.memory_bytes() for t in self._tables)
            first = not c.held_beyond
            cut = c.observe(rss, in_flight, store_used, tables)
            if not cut:
                return 0
            if self._store is not None:
                self._store.set_capacity(c.store_capacity)
        (log.warning if first else log.info)(
            "shard RSS %d bytes holds %d beyond its memory split (fixed overhead %d, disk "
            "tier's cache %d, tables %d resident, requests in flight %d): the cache may now "
            "hold %d bytes, the tables %d",
            rss,
            c.held_beyond,
            self.budget.fixed_overhead,
            store_used,
            tables,
            in_flight,
            c.store_capacity,
            c.table_budget,
        )
        release_scratch_memory()  # the cache's evicted blocks back to the OS
        return cut

    def check_request(self, table: TieredTable, unique_keys: int) -> None:
        """Refuse a request whose unique keys alone would take more than
        ``MAX_REQUEST_SHARE`` of the table budget: demoting could never make room."""
        if not self.limit:
            return
        ws = int(unique_keys * table.key_bytes())
        self.working_set_bytes = max(self.working_set_bytes, ws)
        if ws > self.table_budget * MAX_REQUEST_SHARE:
            working_set = self._working_set(table, unique_keys, ws)
            raise MemoryLimitError(
                f"spec.ps.memoryLimit ({self.limit} bytes) is too small for the working set: "
                f"one request to table {table.name!r} needs {ws} bytes for {unique_keys} "
                f"keys, more than {int(MAX_REQUEST_SHARE * 100)} % of the "
                f"{self.table_budget} bytes left for tables; raise spec.ps.memoryLimit to at "
                f"least {working_set.suggested_memory_limit} (or the PS memory), or use more "
                "PS replicas or smaller batches",
                working_set,
            )

    def _working_set(self, table: TieredTable, keys: int, ws: int) -> WorkingSet:
        """The refused request's numbers, with the limit that would have held it."""
        need = int(ws / MAX_REQUEST_SHARE) + 1
        disk = table.disk_bytes()
        full = table.pressure_evictions_total > 0 or (
            self.disk_limit > 0 and disk >= self.disk_limit * DISK_FULL_SHARE
        )
        return WorkingSet(
            keys=keys,
            needed_bytes=ws,
            table_budget=self.table_budget,
            memory_limit=self.limit,
            suggested_memory_limit=self.budget.limit_for_tables(need, len(self._tables)),
            disk_bytes=disk,
            disk_limit=self.disk_limit,
            disk_full=full,
        )

    def ram_bytes(self) -> int:
        return sum(t.ram_bytes() for t in self._tables)

    def make_room(self, table: TieredTable, incoming_keys: int) -> int:
        """Before a request that may bring ``incoming_keys`` keys into ``table``'s RAM:
        demote its coldest keys so they fit in rows already resident (no slab grows past
        the budget). Returns keys moved."""
        if not self.limit:
            return 0
        need = int(incoming_keys * table.key_bytes())
        others = sum(t.memory_bytes() for t in self._tables if t is not table)
        if others + table.ram_bytes() + need <= self.table_budget:
            return 0
        target = self.table_budget - self._headroom(table) - others - need
        # Past the budget by more (a cut by ``observe_after_trim``): a step a request, the
        # request's keys taking rows already resident meanwhile.
        target = max(target, table.ram_bytes() - need - self._step_bytes(table))
        self._note_spill(table)
        return self._demoted(table.demote(max(target, 0)))

    def enforce(self) -> int:
        """After a request: demote until the tables are ``_headroom`` under the table
        budget when they are past it; returns keys moved (or evicted when the disk tier is
        full too). Otherwise give freed heap back if the process is near its limit."""
        if not self.limit:
            return 0
        if self.ram_bytes() <= self.table_budget:
            self.trim_near_limit()
            return 0
        moved = 0
        for t in sorted(self._tables, key=lambda t: t.ram_bytes(), reverse=True):
            excess = self.ram_bytes() - (self.table_budget - self._headroom(t))
            if excess <= 0:
                break
            self._note_spill(t)
            moved += t.demote(t.ram_bytes() - min(excess, self._step_bytes(t)))
        return self._demoted(moved)

    def _step_bytes(self, table: TieredTable) -> int:
        """The most one demotion moves beyond a request's own keys (``DEMOTE_STEP_KEYS``)."""
        return int(DEMOTE_STEP_KEYS * table.key_bytes())

    def _headroom(self, table: TieredTable) -> int:
        """Bytes a demotion frees beyond what is needed, so the next requests do not each
        demote: ``1 - LOW_WATER`` of the budget, at most a step."""
        return min(int(self.table_budget * (1 - LOW_WATER)), self._step_bytes(table))

    def trim_near_limit(self) -> None:
        """``malloc_trim`` once RSS is within ``TRIM_MARGIN_SHARE`` of the scratch reserve
        from the limit. Requests of 16 server threads leave freed pages in glibc's heaps
        (measured over gRPC: the heaps grew ~45 MB over a pull phase and gave nearly all of
        it back at a trim), which no demotion would release. Reading the RSS costs ~10 µs a
        request; the trim, a few ms, runs only near the limit, and when it cannot get below
        the mark (the memory is live) not again until RSS grew by ``TRIM_STEP``."""
        if not self.budget.fixed_overhead:
            return
        mark = self.limit - int(self.budget.scratch * TRIM_MARGIN_SHARE)
        rss = current_rss_bytes()
        if rss <= mark or (self._trimmed_at and rss <= self._trimmed_at + TRIM_STEP):
            return
        self.release_memory()
        after = current_rss_bytes()
        self._trimmed_at = after if after > mark else 0

    def _note_spill(self, table: TieredTable) -> None:
        """Say once per table that its keys start moving to disk (an operator's signal)."""
        if table.name not in self._spilled:
            self._spilled.add(table.name)
            log.info("table %s: RAM tier at its budget; cold keys go to disk", table.name)

    def _demoted(self, moved: int) -> int:
        """After a demotion: give the freed scratch back, then check the process's RSS
        against the limit (the feedback for what the split did not foresee)."""
        if not moved or not self.budget.fixed_overhead:
            return moved
        self.release_memory()
        rss = current_rss_bytes()
        if rss > self.limit:
            # The tables gave their freed pages back: what is over is outside them. Said
            # once per demotion so the operator sees which share to raise.
            log.warning(
                "shard RSS %d bytes is past memoryLimit %d (fixed overhead %d, store %d, "
                "scratch reserve %d, tables %d resident)",
                rss,
                self.limit,
                self.budget.fixed_overhead,
                self.budget.store,
                self.budget.scratch,
                sum(t.memory_bytes() for t in self._tables),
            )
        return moved


def bound_allocator() -> None:
    """Make large freed allocations go back to the OS at once (glibc; a no-op elsewhere).

    glibc raises its mmap threshold to the size of every mapped block freed (up to 32 MiB),
    so after a few large numpy temporaries, blocks of that size come from the heap, where a
    free leaves the pages resident (measured: ~40 MB of a capped shard's RSS). A fixed
    threshold keeps large temporaries in their own mappings. And each of the many server
    threads would get a heap of its own (up to 8 per core), each keeping its freed small
    blocks: a few heaps shared by all keep that bounded.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_ARENA_MAX, ARENA_MAX)
    except (OSError, AttributeError):
        return


def current_rss_bytes() -> int:
    """The process's resident set size now (``/proc/self/statm``; 0 where absent)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    """The process's peak resident set size (``getrusage``; kilobytes on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
