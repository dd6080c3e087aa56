"""One sparse table of one shard: hash index + compact row slabs (``slabs``) + its locking.

State is one immutable ``slabs.Arrays`` tuple (index, primary and embedx slabs, hot
counters) swapped as a whole when anything grows, so a reader that took ``self._arrays``
once sees arrays that belong together (a row id found in ``slots`` is always inside
``keys`` and ``slab``), even while a writer reallocates. Growth is geometric with
``np.zeros`` (untouched pages are not resident), done before a kernel runs, so kernels
never reallocate. Embedx rows and hot-counter entries are allocated after a push's
parallel row updates, on one thread (room reserved first); a pull that meets a side-table
index beyond its arrays pulls again with the current ones.

Consistency (``TableLock``):

- pulls are *readers*: any number run at once, and they run concurrently with one pusher.
  A pull sees each key either before or after a concurrent push of it (a row may be read
  mid-update: some columns new, some old — the usual asynchronous-SGD contract).
- pushes are *writers*: serialised per table by one mutex, so totals are exact.
  Merging duplicate keys of a request happens before the mutex is taken.
- shrink and load are *exclusive*: they wait for readers to drain and block new ones,
  because deletion moves entries in ``slots`` and load swaps the whole table.
- saves hold ``maintenance`` (no shrink/load meanwhile) and take the writer mutex only while
  copying one logical shard's rows, so pulls and pushes keep flowing during a save.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from streamtrain_ps.config import TableConfig
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.engine import packed as pk
from streamtrain_ps.engine.accessor import RowLayout, accessor_params
from streamtrain_ps.engine.kernels import ADMISSIONS, EVICTIONS, EXPANDED, REFUSED, SLOTS_USED
from streamtrain_ps.engine.optim import table_params
from streamtrain_ps.engine.slabs import (
    Arrays,
    HotCounters,
    Part,
    TableContent,
    build_content,
    build_from_parts,
    empty_arrays,
)
from streamtrain_ps.engine.table_lock import TableLock
from streamtrain_ps.engine.table_saves import TableSaves
from streamtrain_ps.errors import InvalidRequestError

#: Pulls and pushes of at least this many keys are split over two threads.
SPLIT_MIN_KEYS = 32_768
#: Merging in two parts doubles the merge's scratch memory; bulk pushes beyond this many
#: keys merge on one thread (they are rare, and their scratch would linger as RSS).
MERGE_SPLIT_MAX_KEYS = 262_144
#: Large pushes (bulk loads) are applied in chunks of merged keys, so the per-push scratch
#: arrays stay small: big short-lived allocations linger in the malloc heap and would show
#: up as resident memory per key.
APPLY_CHUNK = 131_072
#: "Not recorded" for the pull kernel's disk-tier outputs.
_NONE = np.empty(0, dtype=np.uint8)


class Merged(NamedTuple):
    """One part of a merged push, as ``kernels.merge_push`` returns it."""

    code: int
    n: int  # unique keys, or the offending index when code != OK
    keys: npt.NDArray[np.uint64]
    grads: npt.NDArray[np.float32]
    shows: npt.NDArray[np.float32]
    clicks: npt.NDArray[np.float32]
    slots: npt.NDArray[np.uint32]


class SparseTable:
    """One table: values of the keys a shard owns, updated by the table's optimizer."""

    def __init__(
        self,
        config: TableConfig,
        seed: int = 0,
        capacity: int = 0,
        helpers: Executor | None = None,
    ) -> None:
        """``helpers``: threads that may run half of a large pull or push (nogil kernels),
        so one caller can use two cores; None runs everything on the caller's thread."""
        self.config = config
        self._helpers = helpers
        self.name = config.name
        self.layout = RowLayout.of(config)
        self.lock = TableLock()
        self._fp = table_params(config.optimizer)
        self._ap = accessor_params(config)
        lay = self.layout
        self._ip = np.array([lay.embedx_dim, lay.kind, lay.xptr, lay.embed_kind], dtype=np.int64)
        self._seed = table_seed(seed, config.name)
        self._meta = ix.new_meta(kn.TABLE_META_SIZE)
        self._arrays = empty_arrays(capacity, capacity, lay)  # untouched pages: not resident
        self.saves: TableSaves[SparseTable] = TableSaves(self)

    # -- hot paths ------------------------------------------------------------------------

    def pull(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        return self._pull_ram(keys, _NONE, _NONE)

    def _pull_ram(
        self,
        keys: npt.NDArray[np.uint64],
        missed: npt.NDArray[np.uint8],
        touched: npt.NDArray[np.uint8],
    ) -> npt.NDArray[np.float32]:
        """The RAM pull; ``missed`` (one byte a key) and ``touched`` (one bit a row) are
        the disk tier's records (``kernels.pull_kernel``), empty when not wanted."""
        out = np.empty((keys.size, self.layout.pull_dim), dtype=np.float32)
        with self.lock.read():
            while True:  # again if a hot key moved into a side table grown after we looked
                a = self._arrays
                args = (a.slots, a.keys, a.slab, a.slab_u32, a.xslab, a.hot)
                work = partial(_pull, args, keys, out, missed, touched)
                if not self._split(keys.size, work):
                    break
                missed[:] = 0
        return out

    def rows_of(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Row id of each key (-1 if absent); for tools and tests that read full rows."""
        out = np.empty(keys.size, dtype=np.int64)
        with self.lock.read():
            a = self._arrays
            ix.lookup_many(a.slots, a.keys, keys, out)
        return out

    def merge(
        self,
        keys: npt.NDArray[np.uint64],
        grads: npt.NDArray[np.float32],
        shows: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
        slots: npt.NDArray[np.uint32],
        route: tuple[int, int, int],
    ) -> list[Merged]:
        """Validate and merge a push (``kernels.merge_push``) without any lock: in two parts
        on two threads for large pushes. ``route`` = (logicalShards, num_shards, shard_index).
        """
        args = (keys, grads, shows, clicks, slots, *route)
        kernel = cast(Callable[..., Any], kn.merge_push)  # the Dispatcher stub lacks *args
        if self._helpers is None or not SPLIT_MIN_KEYS <= keys.size <= MERGE_SPLIT_MAX_KEYS:
            return [Merged(*kernel(*args, 0, 1))]
        try:
            other = self._helpers.submit(kernel, *args, 1, 2)
        except RuntimeError:  # helpers shut down (Shard.close)
            return [Merged(*kernel(*args, 0, 1))]
        first = Merged(*kernel(*args, 0, 2))
        second = Merged(*(kernel(*args, 1, 2) if other.cancel() else other.result()))
        return [first, second]

    def push_merged(self, parts: list[Merged], has_slots: bool) -> None:
        """Apply merged pushes (keys unique across all ``parts``, error code OK).

        Per chunk: index first (serial: it may create keys), then the row updates, split
        over two threads for large chunks — the rows are distinct, so halves never collide.
        """
        total = sum(int(p.n) for p in parts)
        chunk = min(max(total, 1), APPLY_CHUNK)
        rows = np.empty(chunk, dtype=np.int64)
        created = np.empty(chunk, dtype=np.bool_)
        todo = np.empty(chunk, dtype=np.uint8)
        with self.lock.write():
            self._before_push(parts)
            if has_slots:
                parts = [p._replace(slots=self._slot_codes(p.slots[: int(p.n)])) for p in parts]
            a = self._reserve(self._new_keys(parts, total))
            for p in parts:
                n = int(p.n)
                for c0 in range(0, n, APPLY_CHUNK):
                    c1 = min(n, c0 + APPLY_CHUNK)
                    k = p.keys[c0:c1]
                    r, cr, ad = rows[: c1 - c0], created[: c1 - c0], todo[: c1 - c0]
                    ix.insert_many(a.slots, a.keys, self._meta, k, r, cr)
                    tail = (
                        k,
                        p.grads[c0:c1],
                        p.shows[c0:c1],
                        p.clicks[c0:c1],
                        p.slots[c0:c1],
                        has_slots,
                        self._ip,
                        self._ap,
                        self._fp,
                        self._seed,
                    )
                    pending = self._split(
                        c1 - c0,
                        partial(_update, (a.slab, a.slab_u32, a.xslab, a.hot, r, cr, ad), tail),
                    )
                    self._meta[REFUSED] += pending // kn.REFUSED_UNIT
                    pending %= kn.REFUSED_UNIT
                    if pending:
                        a = self._reserve_x(pending % kn.PROMOTED, pending // kn.PROMOTED)
                        admitted = int(
                            kn.settle_rows(
                                a.slab,
                                a.slab_u32,
                                a.xslab,
                                a.xslab_u32,
                                a.hot,
                                self._meta,
                                r,
                                ad,
                                c1 - c0,
                                k,
                                self._ip,
                                self._fp,
                                self._seed,
                            )
                        )
                        self._meta[EXPANDED] += admitted
                        self._meta[ADMISSIONS] += admitted

    def _slot_codes(self, slots: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        """The slot dictionary's codes of ``slots`` (``packed``); writer lock held. Raises
        ``InvalidRequestError`` before anything of the push is applied when the table
        would need more than ``packed.SLOT_CODES`` distinct slot ids."""
        a = self._arrays
        codes = np.empty(slots.size, dtype=np.uint32)
        full = int(pk.slot_codes(a.slot_map, a.slot_ids, self._meta, SLOTS_USED, slots, codes))
        if full >= 0:
            raise InvalidRequestError(
                "slots",
                f"slot id {int(slots[full])}: table {self.name!r} already holds "
                f"{pk.SLOT_CODES} distinct slot ids, the most a table can hold",
            )
        return codes

    def _before_push(self, parts: list[Merged]) -> None:
        """Hook run under the writer lock before a push resolves its keys (the disk tier
        promotes the push's disk-resident keys here, so promotion and push are atomic)."""

    def _split(self, n: int, work: Callable[[int, int], Any]) -> int:
        """Run ``work(lo, hi)`` over ``range(n)``: in two halves on two threads when the
        batch is large and a helper thread is available, else in one go. Returns the sum of
        the halves' results (ints) or 0."""
        if self._helpers is None or n < SPLIT_MIN_KEYS:
            return int(work(0, n) or 0)
        mid = n // 2
        try:
            other = self._helpers.submit(work, mid, n)
        except RuntimeError:  # helpers shut down (Shard.close): run on this thread
            return int(work(0, n) or 0)
        first = int(work(0, mid) or 0)
        if other.cancel():  # the helper was busy elsewhere: do it ourselves
            return first + int(work(mid, n) or 0)
        return first + int(other.result() or 0)

    def _new_keys(self, parts: list[Merged], total: int) -> int:
        """How many of a merged push's keys are new; call with the writer lock held (only
        the writer creates keys). Counted only when the worst case (every key new) would not
        fit the current arrays: pushing keys that exist must never grow or rehash a table."""
        a = self._arrays
        count = int(self._meta[ix.COUNT])
        high = int(self._meta[ix.NEXT_ROW])
        fits_rows = high + max(0, total - int(self._meta[ix.FREE_LEN])) <= a.keys.shape[0]
        if fits_rows and ix.needed_capacity(count + total) <= a.slots.size:
            return total
        return sum(int(ix.count_missing(a.slots, a.keys, p.keys[: int(p.n)])) for p in parts)

    def _reserve(self, extra: int) -> Arrays:
        """Arrays with room for ``extra`` new keys; call with the writer lock held."""
        a = self._arrays
        count = int(self._meta[ix.COUNT])
        high = int(self._meta[ix.NEXT_ROW])
        need_rows = high + max(0, extra - int(self._meta[ix.FREE_LEN]))
        slots = ix.grown_slots(a.slots, a.keys, count + extra)
        keys = ix.grown_rows(a.keys, high, need_rows)
        slab = ix.grown_rows(a.slab, high, need_rows)
        if slots is not a.slots or keys is not a.keys or slab is not a.slab:
            a = a._replace(slots=slots, keys=keys, slab=slab)
            self._arrays = a
        return a

    def _reserve_x(self, extra: int, extra_hot: int) -> Arrays:
        """Arrays with room for ``extra`` more embedx rows and ``extra_hot`` more side-table
        entries; writer lock held."""
        a = self._arrays
        m = self._meta
        high = int(m[kn.X_NEXT])
        xslab = ix.grown_rows(a.xslab, high, high + max(0, extra - int(m[kn.X_FREE_LEN])))
        hhigh = int(m[kn.HOT_NEXT])
        hot = ix.grown_rows(a.hot, hhigh, hhigh + max(0, extra_hot - int(m[kn.HOT_FREE_LEN])))
        if xslab is not a.xslab or hot is not a.hot:
            a = a._replace(xslab=xslab, hot=hot)
            self._arrays = a
        return a

    # -- maintenance ----------------------------------------------------------------------

    def shrink(self) -> tuple[int, int]:
        """Decay and delete (§4); deleted keys become tombstones. Returns (before, deleted)."""
        before, deleted = self.shrink_keys()
        return before, int(deleted.size)

    def shrink_keys(self) -> tuple[int, npt.NDArray[np.uint64]]:
        """``shrink`` returning the deleted keys (a staged save must forget them: their rows
        are reused by later creations)."""
        with self.lock.maintenance, self.lock.exclusive():
            return self._shrink_locked()

    def _shrink_locked(self) -> tuple[int, npt.NDArray[np.uint64]]:
        """``shrink_keys`` of the RAM rows; hold maintenance and exclusive."""
        a = self._arrays
        before = int(self._meta[ix.COUNT])
        deleted = np.empty(before, dtype=np.uint64)
        nd = int(
            kn.shrink_kernel(
                a.slots,
                a.keys,
                self._meta,
                a.slab,
                a.slab_u32,
                a.xslab,
                a.xslab_u32,
                a.hot,
                self._ap,
                deleted,
            )
        )
        gone = deleted[:nd].copy()
        if nd:
            self.saves.add_tombstones(gone)
        return before, gone

    def build(
        self,
        keys: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.float32],
        tombstones: npt.NDArray[np.uint64],
        hot: HotCounters | None = None,
    ) -> TableContent:
        """A complete new content for this table (load), built without touching the table.
        ``hot``: exact counters of the hot keys among ``rows`` (a checkpoint has them).

        Raises ``ValueError`` naming a key listed twice.
        """
        return build_content(self.layout, keys, rows, tombstones, hot)

    def build_parts(self, total: int, parts: Iterable[Part]) -> TableContent:
        """``build`` from ``total`` keys arriving in ``parts``, each dropped once copied
        (a load's peak memory is the new table plus one part, not plus the whole save)."""
        return build_from_parts(self.layout, total, parts)

    def install(self, content: TableContent) -> None:
        """Swap in a content from ``build`` (waits for readers; counters carry over)."""
        with self.lock.exclusive():
            content.meta[ADMISSIONS] = self._meta[ADMISSIONS]
            content.meta[EVICTIONS] = self._meta[EVICTIONS]
            content.meta[REFUSED] = self._meta[REFUSED]
            self._meta = content.meta
            self._arrays = content.arrays
            self.saves.replace_tombstones(content.tombstones)

    # -- introspection --------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._meta[ix.COUNT])

    @property
    def expanded_keys(self) -> int:
        return int(self._meta[EXPANDED])

    @property
    def admissions_total(self) -> int:
        return int(self._meta[ADMISSIONS])

    @property
    def evictions_total(self) -> int:
        return int(self._meta[EVICTIONS])

    @property
    def refused_total(self) -> int:
        """Key updates of pushes refused because the row would have held inf or NaN
        (``kernels.update_rows``); the rest of those pushes applied."""
        return int(self._meta[REFUSED])

    @property
    def slot_capacity(self) -> int:
        """Size of the hash index's slot array (a power of two; grows only for new keys)."""
        return int(self._arrays.slots.size)

    def memory_bytes(self) -> int:
        """Bytes in use: the slot array plus key and row storage up to the high-water mark
        (capacity beyond it is reserved address space that was never touched)."""
        a = self._arrays
        high = int(self._meta[ix.NEXT_ROW])
        xhigh = int(self._meta[kn.X_NEXT])
        per_row = a.keys.itemsize + a.slab.shape[1] * 4
        hot = int(self._meta[kn.HOT_NEXT]) * a.hot.shape[1] * 8
        return int(a.slots.nbytes + high * per_row + xhigh * a.xslab.shape[1] * 4 + hot)

    @property
    def hot_keys(self) -> int:
        """Keys whose counters live in the exact float64 side table."""
        return int(self._meta[kn.HOT_NEXT] - self._meta[kn.HOT_FREE_LEN])


def _pull(
    arrays: tuple[Any, ...],
    keys: npt.NDArray[np.uint64],
    out: npt.NDArray[np.float32],
    missed: npt.NDArray[np.uint8],
    touched: npt.NDArray[np.uint8],
    lo: int,
    hi: int,
) -> int:
    """``kernels.pull_kernel`` over ``lo:hi``; returns the stale keys (see there)."""
    kernel: Any = kn.pull_kernel  # numba's Dispatcher stub does not model *args
    miss = missed[lo:hi] if missed.size else missed
    return int(kernel(*arrays, keys[lo:hi], out[lo:hi], miss, touched))


def _update(head: tuple[Any, ...], tail: tuple[Any, ...], lo: int, hi: int) -> int:
    """``kernels.update_rows`` over ``lo:hi`` (the arguments around the range bound once)."""
    kernel: Any = kn.update_rows  # numba's Dispatcher stub does not model *args
    return int(kernel(*head, lo, hi, *tail))


def table_seed(seed: int, name: str) -> np.uint64:
    """Per-table init seed: FNV-1a of the name mixed with the configured seed."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h ^ ((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF))
