"""What saves read from and commit to a sparse table: its live rows grouped by logical
shard, consistent copies of full rows with exact hot counters, the save filter applied
under the writer lock, a committed save's side effects, and the tombstones of deleted keys.

A collaborator each ``table.SparseTable`` holds as ``saves`` (it owns the tombstones and
reads the table's rows under the table's lock), so the engine's hot paths and growth stay in
``table`` and what a save sees of a table reads on its own; ``tiering.TieredTable`` extends
the save side to its disk rows.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SaveMode
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.engine import snapshot as sn
from streamtrain_ps.engine.slabs import HotCounters
from streamtrain_ps.sharding import logical_shard

if TYPE_CHECKING:
    from streamtrain_ps.engine.table import SparseTable

TableT_co = TypeVar("TableT_co", bound="SparseTable", covariant=True)


class TableSaves(Generic[TableT_co]):
    """The save side of ``table`` (module docstring)."""

    def __init__(self, table: TableT_co) -> None:
        # A weak reference: the table holds its saves, and a cycle would keep a dropped
        # table's rows resident until the cyclic collector ran.
        self._table = weakref.ref(table)
        self._tombstones: list[npt.NDArray[np.uint64]] = []

    @property
    def table(self) -> TableT_co:
        table = self._table()
        assert table is not None, "a table's saves outlived the table"
        return table

    def rows_by_logical_shard(
        self, logical_shards: int, mode: SaveMode = SaveMode.CHECKPOINT
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(rows, offsets): live rows grouped by logical shard (those of shard s are
        ``rows[offsets[s]:offsets[s + 1]]``). Hold ``lock.maintenance``.

        For a delta or base only the rows passing its filter now, by a sequential scan
        (``snapshot`` tests them again when it copies them)."""
        t = self.table
        with t.lock.write():
            a = t._arrays
            count = int(t._meta[ix.COUNT])
            rows = np.empty(count, dtype=np.int64)  # pages never written stay unmapped
            offsets = np.zeros(logical_shards + 1, dtype=np.int64)
            if mode in (SaveMode.CHECKPOINT, SaveMode.BATCH):
                sn.group_rows(a.slots, a.keys, logical_shards, rows, offsets)
                return rows, offsets
            high = int(t._meta[ix.NEXT_ROW])
            sp = self.save_params()
            args = (a.slots, a.keys, a.slab, a.slab_u32, a.xslab_u32, a.hot, high, sp)
            n = int(sn.select_rows(*args, mode == SaveMode.DELTA, rows))
            rows = rows[:n].copy()
            shard = logical_shard(a.keys[rows], logical_shards)
        order = np.argsort(shard, kind="stable")
        offsets[1:] = np.cumsum(np.bincount(shard, minlength=logical_shards))
        return rows[order], offsets

    def save_params(self) -> npt.NDArray[np.float64]:
        """The save filter's parameters (``snapshot.select_rows``, ``disk_rows.passes``)."""
        c = self.table.config
        return np.array(
            [c.nonclkCoeff, c.clickCoeff, c.baseThreshold, c.deltaKeepDays, c.deltaThreshold]
        )

    def copy_rows(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
        """Keys and full rows of ``rows``, copied under the writer lock (a consistent view);
        hot keys' counters rounded to float32 (``copy_rows_exact`` has them exactly)."""
        keys, values, _ = self.copy_rows_exact(rows)
        return keys, values

    def copy_rows_exact(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]:
        """``copy_rows`` plus the exact float64 counters of the hot keys among them."""
        with self.table.lock.write():
            return self.gather_locked(rows)

    def gather_locked(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]:
        """``copy_rows_exact`` for a caller that holds the writer lock."""
        t = self.table
        keys = np.empty(rows.size, dtype=np.uint64)
        values = np.empty((rows.size, t.layout.width), dtype=np.float32)
        lay = t.layout
        a = t._arrays
        nhot = int(t._meta[kn.HOT_NEXT] - t._meta[kn.HOT_FREE_LEN])
        pos = np.empty(min(nhot, rows.size), dtype=np.int64)
        counts = np.empty((pos.size, 3), dtype=np.float64)
        args = (
            a.keys,
            a.slab,
            a.slab_u32,
            a.xslab,
            a.hot,
            a.slot_ids,
            rows,
            keys,
            values,
            pos,
            counts,
        )
        nh = int(sn.gather(*args, lay.xptr, lay.xflag))
        return keys, values, HotCounters(pos[:nh], counts[:nh])

    def snapshot(
        self, rows: npt.NDArray[np.int64], mode: SaveMode
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]:
        """The rows a save of ``mode`` writes (``accessor.save_filter``), with their keys,
        full rows and exact hot counters: tested and copied in one hold of the writer lock
        (a consistent copy), and only the kept rows are copied."""
        if mode in (SaveMode.CHECKPOINT, SaveMode.BATCH):
            return (rows, *self.copy_rows_exact(rows))
        sp = self.save_params()
        keep = np.empty(rows.size, dtype=np.bool_)
        with self.table.lock.write():
            a = self.table._arrays
            delta = mode == SaveMode.DELTA
            sn.save_keep(a.slab, a.slab_u32, a.xslab_u32, a.hot, rows, sp, delta, keep)
            kept = rows[keep]
            return (kept, *self.gather_locked(kept))

    def after_save(
        self, rows: npt.NDArray[np.int64], saved_delta: npt.NDArray[np.floating], unseen_inc: bool
    ) -> None:
        """Commit a save: ``delta_score -= saved_delta`` per row, or ``unseen_days += 1``."""
        with self.table.lock.write():
            a = self.table._arrays
            sn.after_save(a.slab, a.slab_u32, a.xslab_u32, a.hot, rows, saved_delta, unseen_inc)

    def add_tombstones(self, keys: npt.NDArray[np.uint64]) -> None:
        """Record ``keys`` as deleted (one batch): the next delta or checkpoint lists them."""
        self._tombstones.append(keys)

    def replace_tombstones(self, keys: npt.NDArray[np.uint64]) -> None:
        """The pending tombstones are ``keys`` (a loaded content's)."""
        self._tombstones = [keys] if keys.size else []

    def tombstones(self) -> npt.NDArray[np.uint64]:
        """Keys deleted since tombstones were last cleared (unique, sorted)."""
        return self.tombstones_marked()[0]

    def tombstones_marked(self) -> tuple[npt.NDArray[np.uint64], int]:
        """The pending tombstones and a mark for ``clear_tombstones(upto=mark)``: shrinks only
        append batches, so clearing the first ``mark`` batches removes exactly these."""
        batches = list(self._tombstones)
        if not batches:
            return np.empty(0, dtype=np.uint64), 0
        return np.unique(np.concatenate(batches)), len(batches)

    def clear_tombstones(self, upto: int | None = None) -> None:
        """Drop every pending tombstone, or only the first ``upto`` batches (a staged save
        that read them; batches appended by a later shrink stay pending)."""
        self._tombstones = [] if upto is None else self._tombstones[upto:]
