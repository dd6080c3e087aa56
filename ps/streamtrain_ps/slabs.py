"""The arrays behind one sparse table (compact rows) and building them whole for a load.

- ``slots`` + ``keys``: the hash index (``streamtrain_ps.index``).
- ``slab``: one primary row per key: the full row's columns up to ``embedx_w`` plus the
  embedx pointer (``accessor.RowLayout.xptr``).
- ``xslab``: one row per *admitted* key: embedx weights and their optimizer state.
- ``hot``: float64 (show, click, delta_score) of the few keys whose counters outgrew float32
  (a hot key's primary row holds show = -1 and the entry's index in CLICK's bits).

All of them are swapped as one ``Arrays`` tuple when any grows, so a reader holding one
tuple sees arrays that belong together.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from streamtrain_ps import index as ix
from streamtrain_ps import kernels as kn
from streamtrain_ps.accessor import CLICK, DELTA, SHOW, RowLayout
from streamtrain_ps.kernels import EXPANDED


class Arrays(NamedTuple):
    slots: npt.NDArray[np.int32]
    keys: npt.NDArray[np.uint64]
    slab: npt.NDArray[np.float32]  # primary rows, one per key (accessor: "compact rows")
    xslab: npt.NDArray[np.float32]  # embedx rows, one per admitted key
    hot: npt.NDArray[np.float64]  # exact (show, click, delta_score) of hot keys

    @property
    def slab_u32(self) -> npt.NDArray[np.uint32]:
        return self.slab.view(np.uint32)

    @property
    def xslab_u32(self) -> npt.NDArray[np.uint32]:
        return self.xslab.view(np.uint32)


class HotCounters(NamedTuple):
    """Exact counters of hot keys: ``counts[i]`` = (show, click, delta_score) of the row
    at ``positions[i]`` of an accompanying array of full rows."""

    positions: npt.NDArray[np.int64]
    counts: npt.NDArray[np.float64]


class TableContent(NamedTuple):
    """A table's whole state, built by ``SparseTable.build`` for a load."""

    arrays: Arrays
    meta: npt.NDArray[np.int64]
    tombstones: npt.NDArray[np.uint64]


def build_content(
    layout: RowLayout,
    keys: npt.NDArray[np.uint64],
    rows: npt.NDArray[np.float32],
    tombstones: npt.NDArray[np.uint64],
    hot: HotCounters | None,
) -> TableContent:
    """A table's whole content from full rows (see ``SparseTable.build``)."""
    lay = layout
    meta = ix.new_meta(kn.TABLE_META_SIZE)
    admitted = rows[:, lay.xflag] >= 0
    na = int(np.count_nonzero(admitted))
    a = empty_arrays(keys.size, na, lay)
    out = np.empty(keys.size, dtype=np.int64)
    created = np.zeros(keys.size, dtype=np.bool_)
    ix.insert_many(a.slots, a.keys, meta, keys, out, created)
    if not created.all():
        raise ValueError(f"key {int(keys[np.argmin(created)])} is listed twice")
    # A fresh index hands out rows 0, 1, 2, ... in order; embedx rows likewise.
    xp = lay.xptr
    a.slab[: keys.size, :xp] = rows[:, :xp]
    a.slab_u32[: keys.size, xp] = np.where(admitted, np.cumsum(admitted), 0)
    a.xslab[:na] = rows[admitted, xp:]
    meta[EXPANDED] = na
    meta[kn.X_NEXT] = na
    if hot is not None and hot.positions.size:
        nh = hot.positions.size
        if hot.positions.min() < 0 or hot.positions.max() >= keys.size:
            raise ValueError("exact counters name rows outside the part (hot_rows)")
        a = a._replace(hot=ix.grown_rows(a.hot, 0, nh))
        a.hot[:nh] = hot.counts
        a.slab[hot.positions, DELTA] = 0.0
        a.slab_u32[hot.positions, CLICK] = np.arange(nh, dtype=np.uint32)
        a.slab[hot.positions, SHOW] = -1.0
        meta[kn.HOT_NEXT] = nh
    return TableContent(a, meta, tombstones.copy())


def empty_arrays(capacity: int, x_capacity: int, lay: RowLayout) -> Arrays:
    rows = max(capacity, 1024)
    return Arrays(
        ix.full_aligned(ix.needed_capacity(capacity), ix.EMPTY, np.int32),
        ix.zeros_aligned((rows,), np.uint64),
        ix.zeros_aligned((rows, lay.primary_width), np.float32),
        ix.zeros_aligned((max(x_capacity, 1024), lay.x_width), np.float32),
        ix.zeros_aligned((1024, 3), np.float64),
    )
